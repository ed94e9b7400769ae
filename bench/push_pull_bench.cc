// Push/pull benchmark against real psd processes, each result printed next to
// plain loopback TCP measured in the same run, in turn with it.
//
//   build/bench/push_pull_bench                     # starts its own psd
//   build/bench/push_pull_bench --reps 30 --sizes 4K,64K,1M,4M,16M,64M
//   build/bench/push_pull_bench --part_kb 4096 --request_kb 8192   # one 4 MiB part per message
//   build/bench/push_pull_bench --busy_poll_us 50 --sizes 4K,64K   # clients poll too
//   (common/net/busy_poll.h) build/bench/push_pull_bench --psd old/psd --ab_psd build/server/psd
//   --sizes 64K   # A/B two psd builds build/bench/push_pull_bench --psd_cpus 1 --client_cpus 0   #
//   psd and the clients on cores of their own build/bench/push_pull_bench --psd_flags "--nice -10"
//   # psd not preempted by the clients (root) build/bench/push_pull_bench --psds 3 --chunk_kb 1024
//   # three psds as shards, tensors spread in 1 MiB chunks
//
// With --ps_hosts it starts nothing: one client with ClientOptions' defaults
// against running psds, one "SIZE push_us pull_us" line per size, for
// bench/python_bench.py to compare psclient with, in turn, on the same psd:
//   build/bench/push_pull_bench --ps_hosts 127.0.0.1:2222 --sizes 4K,4M --reps 50
//
// Plain TCP reference: the same payload written in 1 MiB pieces from one
// thread to another over a loopback socket (the two pinned to different cores),
// answered by a 1-byte acknowledgement, so both sides are "send N bytes, get
// a small answer" as a push is ("small request, get N bytes" for a pull).
//
// Three clients at once are compared with one client and with three plain
// TCP streams at once (each its own sender and receiver thread), measured
// the same way just before them: what the machine's loopback does with
// three concurrent transfers. That table also gives the cores psd and this
// process kept busy (CPU time / wall time) with one client and with three:
// whether a result was bound by psd's event loop, by the clients, or by
// neither; and the cores the whole machine left idle meanwhile.
// One program, so that psd, plain TCP and raw Cap'n Proto are measured in
// the same run, in turn, under the same load.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include <capnp/ez-rpc.h>

#include "bench/bench_psd.h"
#include "schema/ps.capnp.h"
#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/trainer_flags.h"
#include "common/net/socket_stream.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// --client_cpus / --psd_cpus: where this process's client threads and psd
// run (empty: anywhere). The plain TCP reference pins its own threads and
// hands the calling thread back to client_cpus.
cpu_set_t client_cpus;
std::vector<int> psd_cpus;
// --psd_flags: more flags for every psd the benchmark starts.
std::vector<std::string> psd_extra_flags;
// --tls_dir: the psds of the path being measured get these (TLS on their TCP port).
std::vector<std::string> psd_tls_flags;

cpu_set_t cpu_set_of(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (cpus.empty()) {
    for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c) CPU_SET(c, &set);
  }
  return set;
}

void pin_to_core(int core) {
  const cpu_set_t set =
      cpu_set_of({static_cast<int>(core % std::max(1u, std::thread::hardware_concurrency()))});
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1 << 20));
    if (w <= 0) throw std::runtime_error("write failed");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) throw std::runtime_error("read failed");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// The plain TCP reference's sockets: by default the fixed send buffer that
// psd's and libpsclient's same-host connections get (socket_stream.h), so
// the reference is plain TCP at its best here; 0 leaves Linux's autotuning.
int tcp_send_buffer_bytes = ps::same_host_send_buffer_bytes();

void set_tcp_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (tcp_send_buffer_bytes > 0) ps::set_send_buffer(fd, tcp_send_buffer_bytes);
}

// A socket listening on a free loopback port, whose address goes to `addr`.
int loopback_listener(sockaddr_in& addr, int backlog) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      listen(listener, backlog) != 0) {
    throw std::runtime_error("cannot listen on a loopback port");
  }
  return listener;
}

// Seconds for each "send `bytes`, receive a 1-byte ack" over loopback TCP.
std::vector<double> tcp_transfer_samples(size_t bytes, int reps) {
  sockaddr_in addr{};
  const int listener = loopback_listener(addr, 1);
  const int total = reps + 2;
  std::thread receiver([&] {
    pin_to_core(1);
    int fd = accept(listener, nullptr, nullptr);
    set_tcp_options(fd);
    std::vector<char> buf(bytes);
    char ack = 1;
    for (int i = 0; i < total; ++i) {
      read_all(fd, buf.data(), bytes);
      write_all(fd, &ack, 1);
    }
    close(fd);
  });
  pin_to_core(0);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  set_tcp_options(fd);
  std::vector<char> buf(bytes, 'x');
  std::vector<double> times;
  for (int i = 0; i < total; ++i) {
    auto t0 = Clock::now();
    write_all(fd, buf.data(), bytes);
    char ack;
    read_all(fd, &ack, 1);
    if (i >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  close(fd);
  receiver.join();
  close(listener);
  pthread_setaffinity_np(pthread_self(), sizeof(client_cpus), &client_cpus);
  return times;
}

// The benchmark's psd (bench/bench_psd.h), pinned to --psd_cpus. With
// num_shards > 1, shard shard_index of a job of that many.
struct Psd : ps::bench::BenchPsd {
  Psd(const std::string& binary, const std::string& unix_socket, int busy_poll_us,
      int shard_index = 0, int num_shards = 1)
      : BenchPsd(binary, flags(unix_socket, busy_poll_us, shard_index, num_shards), "psd-bench",
                 [] {
                   const cpu_set_t cpus = cpu_set_of(psd_cpus);
                   sched_setaffinity(0, sizeof(cpus), &cpus);
                 }) {}

  static std::vector<std::string> flags(const std::string& unix_socket, int busy_poll_us,
                                        int shard_index, int num_shards) {
    std::vector<std::string> args;
    if (busy_poll_us >= 0) {
      args.push_back("--busy_poll_us");
      args.push_back(std::to_string(busy_poll_us));
    }
    if (num_shards > 1) {
      args.insert(args.end(), {"--shard_index", std::to_string(shard_index), "--num_shards",
                               std::to_string(num_shards)});
    }
    if (!unix_socket.empty()) {
      args.push_back("--unix_socket");
      args.push_back(unix_socket);
    }
    args.insert(args.end(), psd_extra_flags.begin(), psd_extra_flags.end());
    args.insert(args.end(), psd_tls_flags.begin(), psd_tls_flags.end());
    return args;
  }
};

// The same 4 KiB pull as raw Cap'n Proto RPC issued from the calling thread:
// what libpsclient's hand-over to its event-loop thread costs on top.
double raw_capnp_pull_seconds(const std::string& address, const std::string& name, int reps) {
  capnp::EzRpcClient rpc(address);
  auto shard = rpc.getMain<ps::wire::Shard>();
  auto& ws = rpc.getWaitScope();
  auto hello = shard.helloRequest();
  hello.setProtocolVersion(ps::wire::K_PROTOCOL_VERSION);
  hello.setWorkerIndex(-1);
  hello.send().wait(ws);
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) {
    auto t0 = Clock::now();
    auto req = shard.pullRequest();
    req.initNames(1).set(0, name);
    req.send().wait(ws);
    if (i >= 2) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

size_t parse_size(const std::string& s) {
  size_t mult = 1;
  std::string num = s;
  char last = s.empty() ? 0 : s.back();
  if (last == 'K' || last == 'k') mult = 1 << 10;
  if (last == 'M' || last == 'm') mult = 1 << 20;
  if (mult != 1) num = s.substr(0, s.size() - 1);
  return std::stoull(num) * mult;
}

std::string size_name(size_t b) {
  if (b >= (1 << 20)) return std::to_string(b >> 20) + " MiB";
  return std::to_string(b >> 10) + " KiB";
}

struct Measured {
  double push_s, pull_s;
};

// CPU time of the psds (all their threads, summed) and of this process, to
// tell whether a measurement was bound by CPU: how many cores each kept busy.
struct CpuClock {
  std::vector<pid_t> psds;
  Clock::time_point wall = Clock::now();
  double psd_s = psd_seconds(psds), self_s = self_seconds();

  // The whole machine's idle and softirq time (/proc/stat, in USER_HZ
  // ticks). Idle is time no thread ran: with psd's loop the bottleneck,
  // cores the clients left unused. Softirq is the kernel's loopback work,
  // mostly run inside psd's and the clients' own time, so it overlaps theirs.
  struct MachineTicks {
    double idle = 0, softirq = 0;
  };
  static MachineTicks machine() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    unsigned long long user, nice, system, idle, iowait, irq, softirq;
    if (!(in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq)) return {};
    return {static_cast<double>(idle + iowait), static_cast<double>(softirq)};
  }
  MachineTicks machine_ticks = machine();

  static double psd_seconds(const std::vector<pid_t>& pids) {
    // schedstat's on-CPU nanoseconds, summed over threads: /proc/PID/stat
    // counts 10 ms ticks, too coarse for runs of tens of milliseconds.
    double sum = 0;
    for (const pid_t pid : pids) {
      std::error_code ec;
      for (const auto& task :
           std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        std::ifstream in(task.path() / "schedstat");
        unsigned long long on_cpu = 0;
        if (in >> on_cpu) sum += on_cpu * 1e-9;
      }
    }
    return sum;
  }
  static double self_seconds() {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);  // threads that have ended included
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec +
           r.ru_stime.tv_usec * 1e-6;
  }
  struct Cores {
    double psd, clients, idle, softirq;
  };
  // Cores kept busy since construction (the clients: this process).
  Cores cores() const {
    const double wall_s = std::chrono::duration<double>(Clock::now() - wall).count();
    const MachineTicks now = machine();
    const double tick_s = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
    return {(psd_seconds(psds) - psd_s) / wall_s, (self_seconds() - self_s) / wall_s,
            (now.idle - machine_ticks.idle) * tick_s / wall_s,
            (now.softirq - machine_ticks.softirq) * tick_s / wall_s};
  }
};

// Push and pull latency samples of one client for a tensor of `bytes`.
struct Samples {
  std::vector<double> push, pull;
};

void sample_one(ps::Client& client, const std::string& name, size_t bytes, int reps, Samples& out) {
  std::vector<float> buf(bytes / 4, 0.0f);
  for (int i = 0; i < reps + 2; ++i) {
    auto t0 = Clock::now();
    client.push(name, buf);
    auto t1 = Clock::now();
    client.pull(name, buf);
    auto t2 = Clock::now();
    if (i >= 2) {
      out.push.push_back(std::chrono::duration<double>(t1 - t0).count());
      out.pull.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
  }
}

// Aggregate throughput of `n` streams, each on its own thread doing
// transfer(stream, phase) back to back, all started together: per window
// of `window_s`, the bytes all streams moved inside it (a transfer still
// under way at its end counted by the part of its time inside) over its
// length, as iperf measures parallel streams; the median over windows, as
// the time per transfer, for each phase. A stream the scheduler runs late
// (three client threads and psd share two cores) moves less in the window,
// and that counts against the aggregate. Threads live across windows, so
// thread start-up is not counted.
template <typename Transfer>
std::vector<double> windowed_seconds(int n, int phases, int windows, double window_s,
                                     Transfer transfer) {
  std::vector<double> moved(n);  // transfers inside this window, per stream
  Clock::time_point start;
  const auto window =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s));
  std::barrier sync(n + 1);
  std::vector<std::thread> threads;
  for (int c = 0; c < n; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < windows + 1; ++i) {
        for (int phase = 0; phase < phases; ++phase) {
          sync.arrive_and_wait();
          const auto deadline = start + window;
          double k = 0;
          for (;;) {
            const auto t0 = Clock::now();
            transfer(c, phase);
            const auto t1 = Clock::now();
            if (t1 <= deadline) {
              ++k;
              continue;
            }
            if (t0 < deadline) k += std::chrono::duration<double>(deadline - t0) / (t1 - t0);
            break;
          }
          moved[c] = k;
          sync.arrive_and_wait();
        }
      }
    });
  }
  std::vector<std::vector<double>> seconds(phases);
  for (int i = 0; i < windows + 1; ++i) {
    for (int phase = 0; phase < phases; ++phase) {
      start = Clock::now();  // seen by the streams once the barrier lets them go
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      double transfers = 0;
      for (double m : moved) transfers += m;
      if (i >= 1) seconds[phase].push_back(window_s / transfers);  // first window: warm-up
    }
  }
  for (auto& t : threads) t.join();
  std::vector<double> out;
  for (auto& s : seconds) out.push_back(median(s));
  return out;
}

// psd clients, each pushing (then pulling) its own tensor of `bytes`.
Measured measure_concurrent(std::vector<ps::Client*> clients, size_t bytes, int windows,
                            double window_s) {
  const std::string suffix = "_" + std::to_string(bytes);
  const int n = static_cast<int>(clients.size());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(bytes / 4, 0.0f));
  std::vector<std::string> names;
  for (int c = 0; c < n; ++c) names.push_back("c" + std::to_string(c) + suffix);
  auto s = windowed_seconds(n, 2, windows, window_s, [&](int c, int phase) {
    if (phase == 0)
      clients[c]->push(names[c], bufs[c]);
    else
      clients[c]->pull(names[c], bufs[c]);
  });
  return {s[0], s[1]};
}

// The physical limit for `n` concurrent clients: n plain loopback TCP
// streams, each its own sender and receiver thread ("send `bytes`, get a
// 1-byte ack", as in tcp_transfer_samples), measured as measure_concurrent
// measures clients. Not pinned: 2n threads share the cores, as n clients
// and psd do.
double tcp_concurrent_seconds(int n, size_t bytes, int windows, double window_s) {
  sockaddr_in addr{};
  const int listener = loopback_listener(addr, n);
  std::vector<int> senders(n), receivers(n);
  for (int i = 0; i < n; ++i) {
    senders[i] = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(senders[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
      throw std::runtime_error("connect failed");
    receivers[i] = accept(listener, nullptr, nullptr);
    set_tcp_options(senders[i]);
    set_tcp_options(receivers[i]);
  }
  close(listener);
  std::vector<std::thread> receiving;
  for (int i = 0; i < n; ++i) {
    receiving.emplace_back([fd = receivers[i], bytes] {
      std::vector<char> buf(bytes);
      const char ack = 1;
      try {
        for (;;) {
          read_all(fd, buf.data(), bytes);
          write_all(fd, &ack, 1);
        }
      } catch (const std::runtime_error&) {  // the sender closed: done
      }
    });
  }
  std::vector<std::vector<char>> bufs(n, std::vector<char>(bytes, 'x'));
  auto s = windowed_seconds(n, 1, windows, window_s, [&](int i, int) {
    write_all(senders[i], bufs[i].data(), bytes);
    char ack;
    read_all(senders[i], &ack, 1);
  });
  for (int fd : senders) shutdown(fd, SHUT_WR);
  for (auto& t : receiving) t.join();
  for (int i = 0; i < n; ++i) {
    close(senders[i]);
    close(receivers[i]);
  }
  return s[0];
}

// psd build A against build B: one client each over TCP, push and pull
// latency in blocks of 100 calls taken in turn (A, B, A, B, ...), so a
// machine whose speed drifts compares like with like; per size the median
// of the blocks' medians and the number of blocks B won.
int run_ab(const std::string& a, const std::string& b, const std::vector<size_t>& sizes,
           ps::ClientOptions opts, int blocks, int psd_busy_poll_us) {
  constexpr int kCalls = 100;
  Psd psd_a(a, "", psd_busy_poll_us), psd_b(b, "", psd_busy_poll_us);
  opts.shared_memory_bytes = 0;
  opts.ps_hosts = {"127.0.0.1:" + std::to_string(psd_a.port)};
  ps::Client client_a(opts);
  opts.ps_hosts = {"127.0.0.1:" + std::to_string(psd_b.port)};
  ps::Client client_b(opts);
  ps::Client* clients[2] = {&client_a, &client_b};
  std::printf(
      "A = %s, B = %s: one client each over TCP, medians of %d blocks of %d calls taken in turn\n",
      a.c_str(), b.c_str(), blocks, kCalls);
  std::printf("  %-8s %10s %10s %9s | %10s %10s %9s\n", "size", "push A us", "push B us",
              "B faster", "pull A us", "pull B us", "B faster");
  for (size_t bytes : sizes) {
    const std::string name = "ab" + std::to_string(bytes);
    for (auto* c : clients)
      c->create(
          {{.name = name, .shape = {bytes / 4}, .optimizer = ps::OptimizerConfig::sgd(0.0f)}});
    std::vector<float> buf(bytes / 4, 0.0f);
    std::vector<double> push[2], pull[2];
    int push_wins = 0, pull_wins = 0;
    for (int blk = 0; blk < blocks; ++blk) {
      for (int side = 0; side < 2; ++side) {
        Samples s;
        sample_one(*clients[side], name, bytes, kCalls, s);
        push[side].push_back(median(s.push));
        pull[side].push_back(median(s.pull));
      }
      push_wins += push[1].back() < push[0].back();
      pull_wins += pull[1].back() < pull[0].back();
    }
    std::printf("  %-8s %10.1f %10.1f %6d/%-2d | %10.1f %10.1f %6d/%-2d\n",
                size_name(bytes).c_str(), median(push[0]) * 1e6, median(push[1]) * 1e6, push_wins,
                blocks, median(pull[0]) * 1e6, median(pull[1]) * 1e6, pull_wins, blocks);
  }
  return 0;
}

// One client with ClientOptions' defaults against running psds: per size,
// the medians of `reps` push and pull calls on tensor "cpp_<bytes>".
int run_against(const std::string& hosts, const std::vector<size_t>& sizes, int reps) {
  ps::ClientOptions opts;
  opts.ps_hosts = ps::split_list(hosts);
  ps::Client client(opts);
  for (size_t bytes : sizes) {
    const std::string name = "cpp_" + std::to_string(bytes);
    client.create(
        {{.name = name, .shape = {bytes / 4}, .optimizer = ps::OptimizerConfig::sgd(0.0f)}});
    Samples s;
    sample_one(client, name, bytes, reps, s);
    std::printf("%s %.3f %.3f\n", size_name(bytes).c_str(), median(s.push) * 1e6,
                median(s.pull) * 1e6);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"push_pull_bench: psd push/pull latency and bandwidth against plain loopback TCP"};
  std::string psd_binary = "build/server/psd";
  std::string sizes_flag = "4K,64K,1M,4M,16M,64M";
  int reps = 20;
  bool with_unix = true;
  bool with_shared = true;
  std::size_t chunk_kb = ps::kDefaultChunkBytes >> 10;
  std::size_t part_kb = ps::kDefaultPartBytes >> 10;
  std::size_t request_kb = ps::ClientOptions{}.max_request_bytes >> 10;
  unsigned busy_poll_us = static_cast<unsigned>(ps::ClientOptions{}.busy_poll.count());
  int psd_busy_poll_us = -1;
  app.add_option("--psd", psd_binary, "psd binary to start")->capture_default_str();
  app.add_option("--sizes", sizes_flag, "payload sizes")->capture_default_str();
  app.add_option("--reps", reps, "repetitions per measurement (median reported)")
      ->capture_default_str();
  app.add_option("--unix", with_unix, "also measure the Unix-domain-socket path")
      ->capture_default_str();
  app.add_option(
         "--shared_memory", with_shared,
         "also measure the same-host path with shared memory (ClientOptions::shared_memory_bytes)")
      ->capture_default_str();
  app.add_option("--chunk_kb", chunk_kb, "ClientOptions::chunk_bytes, in KiB")
      ->capture_default_str();
  app.add_option("--part_kb", part_kb, "ClientOptions::part_bytes, in KiB")->capture_default_str();
  app.add_option("--request_kb", request_kb, "ClientOptions::max_request_bytes, in KiB")
      ->capture_default_str();
  app.add_option("--busy_poll_us", busy_poll_us, "ClientOptions::busy_poll of every client, in us")
      ->capture_default_str();
  app.add_option("--psd_busy_poll_us", psd_busy_poll_us, "psd --busy_poll_us (-1: psd's default)")
      ->capture_default_str();
  int tcp_send_buffer_kb = tcp_send_buffer_bytes >> 10;
  app.add_option("--tcp_send_buffer_kb", tcp_send_buffer_kb,
                 "SO_SNDBUF of the plain TCP reference's sockets, in KiB (default: what psd's "
                 "same-host connections "
                 "get; 0: Linux's autotuning)")
      ->capture_default_str();
  std::string client_cpus_flag, psd_cpus_flag;
  app.add_option(
      "--client_cpus", client_cpus_flag,
      "CPUs for this process's client threads, e.g. 0 (default: any); with --psd_cpus, keeps the "
      "scheduler from putting psd's thread and a client on one core");
  app.add_option("--psd_cpus", psd_cpus_flag, "CPUs for the psd it starts, e.g. 1 (default: any)");
  std::string psd_flags;
  app.add_option("--psd_flags", psd_flags,
                 "more flags for each psd it starts, split at spaces, e.g. \"--nice -10\"");
  int num_psds = 1;
  app.add_option("--psds", num_psds,
                 "psds to start for each path, as the shards of one job (tensors placed "
                 "round-robin; with --chunk_kb "
                 "smaller than a tensor, its chunks spread over them): one psd per core on a host "
                 "with cores to spare")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  std::string ab_psd;
  app.add_option("--ab_psd", ab_psd,
                 "instead of the tables: one client's push and pull latency against --psd (A) and "
                 "this psd binary "
                 "(B), --reps blocks of 100 calls each taken in turn");
  std::string against_hosts;
  app.add_option("--ps_hosts", against_hosts,
                 "instead of the tables: start nothing, one client with ClientOptions' defaults "
                 "against these running psds; per size a line 'SIZE push_us pull_us' (medians of "
                 "--reps), as bench/python_bench.py reads");
  std::string tls_dir;
  app.add_option("--tls_dir", tls_dir,
                 "also measure TCP with TLS: DIR holds psd.crt, psd.key (for 127.0.0.1) and ca.crt "
                 "(docs/operations.md, Security)");
  PS_PARSE_FLAGS(app, argc, argv);
  tcp_send_buffer_bytes = tcp_send_buffer_kb << 10;
  std::vector<int> cpus;
  for (const std::string& c : ps::split_list(client_cpus_flag)) cpus.push_back(std::stoi(c));
  client_cpus = cpu_set_of(cpus);
  pthread_setaffinity_np(pthread_self(), sizeof(client_cpus), &client_cpus);
  for (const std::string& c : ps::split_list(psd_cpus_flag)) psd_cpus.push_back(std::stoi(c));
  std::istringstream flag_words(psd_flags);
  for (std::string word; flag_words >> word;) psd_extra_flags.push_back(word);

  std::vector<size_t> sizes;
  for (const std::string& s : ps::split_list(sizes_flag)) sizes.push_back(parse_size(s));
  if (!against_hosts.empty()) {
    try {
      return run_against(against_hosts, sizes, reps);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "push_pull_bench: %s\n", e.what());
      return 1;
    }
  }
  if (!ab_psd.empty()) {
    ps::ClientOptions opts;
    opts.chunk_bytes = chunk_kb << 10;
    opts.part_bytes = part_kb << 10;
    opts.max_request_bytes = request_kb << 10;
    opts.busy_poll = std::chrono::microseconds(busy_poll_us);
    try {
      return run_ab(psd_binary, ab_psd, sizes, opts, reps, psd_busy_poll_us);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "push_pull_bench: %s\n", e.what());
      return 1;
    }
  }

  // The machines this runs on change speed from minute to minute (shared
  // VMs): each size's TCP reference is measured in blocks taken in turn
  // with psd's, so a ratio compares like with like.
  constexpr int kBlocks = 3;
  const int block_reps = std::max(reps / kBlocks, 3);

  auto run_path = [&](const char* label, bool use_unix, bool use_shared, bool use_tls = false) {
    ps::ClientOptions opts;
    psd_tls_flags.clear();
    if (use_tls) {
      psd_tls_flags = {"--tls_cert", tls_dir + "/psd.crt", "--tls_key", tls_dir + "/psd.key"};
      opts.tls_ca = tls_dir + "/ca.crt";
    }
    std::vector<std::unique_ptr<Psd>> psds;
    std::vector<pid_t> psd_pids;
    for (int k = 0; k < num_psds; ++k) {
      const std::string sock =
          use_unix
              ? std::filesystem::temp_directory_path() /
                    ("psd-bench-" + std::to_string(getpid()) + "-" + std::to_string(k) + ".sock")
              : "";
      psds.push_back(std::make_unique<Psd>(psd_binary, sock, psd_busy_poll_us, k, num_psds));
      psd_pids.push_back(psds.back()->pid);
      opts.ps_hosts.push_back(use_unix ? "unix:" + sock
                                       : "127.0.0.1:" + std::to_string(psds.back()->port));
    }
    opts.chunk_bytes = chunk_kb << 10;
    opts.part_bytes = part_kb << 10;
    opts.max_request_bytes = request_kb << 10;
    opts.busy_poll = std::chrono::microseconds(busy_poll_us);
    if (!use_shared) opts.shared_memory_bytes = 0;
    const std::string who = num_psds == 1 ? "psd" : std::to_string(num_psds) + " psds";
    std::printf("%s over %s, 1 client (medians of %d; plain TCP measured in turn with it):\n",
                who.c_str(), label, block_reps * kBlocks);
    std::printf("  %-8s %9s %8s | %10s %8s %7s | %10s %8s %7s\n", "size", "TCP us", "TCP GB/s",
                "push us", "GB/s", "vs TCP", "pull us", "GB/s", "vs TCP");
    ps::Client client(opts);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string name = "t" + std::to_string(sizes[i]);
      client.create(
          {{.name = name, .shape = {sizes[i] / 4}, .optimizer = ps::OptimizerConfig::sgd(0.0f)}});
      std::vector<double> tcp_samples, ping_samples;
      Samples s;
      for (int b = 0; b < kBlocks; ++b) {
        auto t = tcp_transfer_samples(sizes[i], block_reps);
        tcp_samples.insert(tcp_samples.end(), t.begin(), t.end());
        if (sizes[i] == 4096) {
          auto p = tcp_transfer_samples(64, 300);
          ping_samples.insert(ping_samples.end(), p.begin(), p.end());
        }
        sample_one(client, name, sizes[i], block_reps, s);
      }
      const double tcp = median(tcp_samples);
      const Measured m{median(s.push), median(s.pull)};
      std::printf("  %-8s %9.1f %8.2f | %10.1f %8.2f %7.2f | %10.1f %8.2f %7.2f\n",
                  size_name(sizes[i]).c_str(), tcp * 1e6, sizes[i] / tcp / 1e9, m.push_s * 1e6,
                  sizes[i] / m.push_s / 1e9, tcp / m.push_s, m.pull_s * 1e6,
                  sizes[i] / m.pull_s / 1e9, tcp / m.pull_s);
      if (sizes[i] == 4096) {
        const double ping = median(ping_samples);
        std::printf("           plain 64 B ping-pong %.1f us; 4 KiB pull round trip = %.2fx it\n",
                    ping * 1e6, m.pull_s / ping);
        if (num_psds == 1 && !use_tls) {  // (with more, the tensor may be on another)
          const double raw =
              raw_capnp_pull_seconds(opts.ps_hosts[0], name, std::max(reps * 10, 200));
          std::printf(
              "           raw Cap'n Proto pull from the calling thread: %.1f us (%.2fx "
              "ping-pong)\n",
              raw * 1e6, raw / ping);
        }
      }
    }
    std::printf(
        "%s over %s, 3 concurrent clients (aggregate) against 3 plain TCP streams, and the cores "
        "psd and "
        "the clients kept busy, and the machine's idle and softirq cores:\n",
        who.c_str(), label);
    std::printf("  %-8s %-14s | %-26s | %-26s | %-17s | %-18s | %-9s | %-9s\n", "size",
                "TCP 1 / 3 GB/s", "push GB/s vs 1 cl vs 3 TCP", "pull GB/s vs 1 cl vs 3 TCP",
                "1 client: psd cli", "3 clients: psd cli", "idle 1 / 3", "sirq 1 / 3");
    std::vector<std::unique_ptr<ps::Client>> clients;
    for (int c = 0; c < 3; ++c) clients.push_back(std::make_unique<ps::Client>(opts));
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string suffix = "_" + std::to_string(sizes[i]);
      for (int c = 0; c < 3; ++c) {
        clients[c]->create({{.name = "c" + std::to_string(c) + suffix,
                             .shape = {sizes[i] / 4},
                             .optimizer = ps::OptimizerConfig::sgd(0.0f)}});
      }
      const int windows = std::max(reps / 4, 3);
      // Windows long enough for each of three clients to do several
      // transfers in one.
      constexpr double kMinWindow = 0.15;
      constexpr double kTransfersPerWindow = 24;
      // Each plain TCP figure just before psd's with as many streams.
      const double tcp_one = tcp_concurrent_seconds(1, sizes[i], windows, kMinWindow);
      const double tcp_all = tcp_concurrent_seconds(
          3, sizes[i], windows, std::max(kMinWindow, kTransfersPerWindow * tcp_one));
      const CpuClock one_clock{psd_pids};
      Measured one = measure_concurrent({clients[0].get()}, sizes[i], windows, kMinWindow);
      const auto one_cores = one_clock.cores();
      const CpuClock all_clock{psd_pids};
      Measured all = measure_concurrent(
          {clients[0].get(), clients[1].get(), clients[2].get()}, sizes[i], windows,
          std::max(kMinWindow, kTransfersPerWindow * std::max(one.push_s, one.pull_s)));
      const auto all_cores = all_clock.cores();
      const double gb = sizes[i] / 1e9;
      std::printf(
          "  %-8s %6.2f %7.2f | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %13.2f %4.2f | %14.2f %4.2f"
          " | %4.2f %4.2f | %4.2f %4.2f\n",
          size_name(sizes[i]).c_str(), gb / tcp_one, gb / tcp_all, gb / all.push_s,
          one.push_s / all.push_s, tcp_all / all.push_s, gb / all.pull_s, one.pull_s / all.pull_s,
          tcp_all / all.pull_s, one_cores.psd, one_cores.clients, all_cores.psd, all_cores.clients,
          one_cores.idle, all_cores.idle, one_cores.softirq, all_cores.softirq);
    }
    std::printf("\n");
  };
  try {
    run_path("TCP", false, false);
    if (!tls_dir.empty()) run_path("TCP with TLS", false, false, true);
    if (with_unix) run_path("a Unix-domain socket", true, false);
    if (with_shared) run_path("a Unix-domain socket with shared memory", true, true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "push_pull_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
