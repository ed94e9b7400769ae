// Soak under attack (issue 29): one psd and three training workers, first
// alone ("calm"), then while attackers who can reach psd's ports run the
// floods of test/hostile_load_test.cc at the same time ("attack"). Checks,
// and exits 1 if one fails:
//  - training ends with exact values: every worker pushes a gradient of -1
//    to every value with SGD at learning rate 1, so each value must equal
//    the number of pushes made, all workers together;
//  - psd never exits, and its resident memory (VmRSS in /proc/PID/status,
//    sampled every 50 ms) stays within its --max_memory_mb;
//  - the workers' slowest call during the attack stays under --slowest_ms.
// Prints the figures: pushes per second calm and under attack, peak RSS,
// slowest and 99th-percentile call, what the attackers did.
//
//   build/bench/attack_soak --psd build/server/psd --seconds 40
//
// The attacks (each in its own thread, from its own loopback address, so
// that the per-address cap applies to each as to a separate host):
//   flood     bootstrap + 200 pipelined calls without hello, reconnecting
//             whenever psd cuts it off (127.0.0.2);
//   idle      100 connections that never say hello (the per-address cap is
//             64), reopened when closed
//             (127.0.0.3);
//   unread    says hello (anonymous) and pipelines `stats` calls without
//             ever reading a reply (127.0.0.4);
//   large     the header of a 16 MiB message before hello, then as much of
//             it as psd takes (127.0.0.5);
//   slow_http 64 connections to the HTTP port, one byte of a request every
//             200 ms (127.0.0.6).
// Stops only the psd it started (by PID). One file: the attackers, the
// workers and the checks are one program and share its few helpers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <capnp/message.h>
#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>

#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/errors.h"
#include "schema/ps.capnp.h"
#include "test/hand_built_rpc.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// --- psd, started and watched ---

struct Psd {
  pid_t pid = -1;
  int port = 0;
  int http_port = 0;
};

int read_port(const std::string& path, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

Psd start_psd(const std::string& binary, const std::string& dir, int max_memory_mb) {
  const std::vector<std::string> args = {binary,
                                         "--port",
                                         "0",
                                         "--port_file",
                                         dir + "/port",
                                         "--http_port",
                                         "any",
                                         "--http_port_file",
                                         dir + "/http",
                                         "--max_memory_mb",
                                         std::to_string(max_memory_mb),
                                         "--threads",
                                         "2"};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string log = dir + "/psd.log";
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // With the environment as given: meson test sets MALLOC_PERTURB_, which
  // makes resident all memory psd allocates, as an attack that touches it would.
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(nullptr);
  Psd psd;
  if (posix_spawn(&psd.pid, binary.c_str(), &actions, nullptr, argv.data(), env.data()) != 0) {
    psd.pid = -1;
    return psd;
  }
  posix_spawn_file_actions_destroy(&actions);
  const auto deadline = Clock::now() + 10s;
  psd.port = read_port(dir + "/port", deadline);
  psd.http_port = read_port(dir + "/http", deadline);
  return psd;
}

bool alive(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == 0;
}

uint64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// --- Hand-built RPC messages (rpc.capnp) on the Shard bootstrap capability ---

using ps::test::bootstrap_message;
using ps::test::call_message;
using ps::test::flat;

using ps::test::kHello;
using ps::test::kList;
using ps::test::kStats;

// --- Raw sockets from a given loopback address ---

int connect_from(const char* source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    // Connected once writable, within a second.
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof(error);
    if (errno != EINPROGRESS || ::poll(&p, 1, 1000) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

// Sends what the socket takes now; false once the peer is gone.
bool send_some(int fd, const std::vector<char>& bytes, size_t& sent) {
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR || errno == ENOTCONN;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads and drops what has come; false once the peer closed.
bool drain(int fd) {
  char sink[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR;
  }
}

// Whether psd closed the connection (it may have sent an abort message
// first, which is left unread).
bool closed_by_peer(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

struct AttackCounts {
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> closed_by_psd{0};
  std::atomic<uint64_t> bytes_sent{0};
};

void flood_refused_calls(int port, const std::atomic<bool>& stop, AttackCounts& n) {
  std::vector<char> burst = bootstrap_message();
  for (uint32_t id = 1; id <= 200; ++id) {
    auto m = call_message<ps::wire::Shard::ListParams>(id, kList, [](auto) {});
    burst.insert(burst.end(), m.begin(), m.end());
  }
  while (!stop) {
    const int fd = connect_from("127.0.0.2", port);
    if (fd < 0) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    ++n.connections;
    // The whole burst, then read until psd cuts the connection (100 calls
    // refused in a row) or 2 s pass; then again.
    size_t sent = 0;
    const auto until = Clock::now() + 2s;
    bool open = true;
    while (!stop && open && Clock::now() < until) {
      open = send_some(fd, burst, sent) && drain(fd);
      std::this_thread::sleep_for(1ms);
    }
    n.bytes_sent += sent;
    if (!open) ++n.closed_by_psd;
    ::close(fd);
  }
}

void idle_without_hello(int port, const std::atomic<bool>& stop, AttackCounts& n) {
  std::vector<int> fds;
  while (!stop) {
    for (auto it = fds.begin(); it != fds.end();) {
      if (closed_by_peer(*it)) {
        ++n.closed_by_psd;
        ::close(*it);
        it = fds.erase(it);
      } else {
        ++it;
      }
    }
    while (fds.size() < 100) {  // past the per-address cap (64)
      const int fd = connect_from("127.0.0.3", port);
      if (fd < 0) break;
      ++n.connections;
      fds.push_back(fd);
    }
    std::this_thread::sleep_for(100ms);
  }
  for (int fd : fds) ::close(fd);
}

void unread_replies(int port, const std::atomic<bool>& stop, AttackCounts& n) {
  std::vector<char> start = bootstrap_message();
  auto hello = call_message<ps::wire::Shard::HelloParams>(
      1, kHello, [](ps::wire::Shard::HelloParams::Builder p) {
        p.setProtocolVersion(ps::wire::K_PROTOCOL_VERSION);
        p.setWorkerIndex(-1);
      });
  start.insert(start.end(), hello.begin(), hello.end());
  while (!stop) {
    const int fd = connect_from("127.0.0.4", port);
    if (fd < 0) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    ++n.connections;
    std::this_thread::sleep_for(5ms);
    size_t sent = 0;
    send_some(fd, start, sent);
    uint32_t id = 2;
    std::vector<char> burst;
    size_t off = 0;
    while (!stop) {
      if (off == burst.size()) {  // only whole messages: a cut one would be a framing error
        burst.clear();
        off = 0;
        for (int k = 0; k < 500; ++k) {
          auto m = call_message<ps::wire::Shard::StatsParams>(id++, kStats, [](auto) {});
          burst.insert(burst.end(), m.begin(), m.end());
        }
      }
      const size_t before = off;
      if (!send_some(fd, burst, off) || closed_by_peer(fd)) {
        ++n.closed_by_psd;
        break;
      }
      n.bytes_sent += off - before;
      std::this_thread::sleep_for(off < burst.size() ? 50ms : 2ms);
    }
    ::close(fd);
  }
}

void large_before_hello(int port, const std::atomic<bool>& stop, AttackCounts& n) {
  const uint32_t words = (16u << 20) / 8;
  std::vector<char> body(8 + (1u << 20), 0);
  const uint32_t head[2] = {0, words};
  std::memcpy(body.data(), head, sizeof(head));
  while (!stop) {
    const int fd = connect_from("127.0.0.5", port);
    if (fd < 0) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    ++n.connections;
    size_t sent = 0;
    const auto until = Clock::now() + 1s;
    while (!stop && Clock::now() < until && sent < body.size()) {
      if (!send_some(fd, body, sent)) break;
      std::this_thread::sleep_for(2ms);
    }
    n.bytes_sent += sent;
    for (int k = 0; k < 50 && !stop; ++k) {  // psd closes it at the header
      if (closed_by_peer(fd)) {
        ++n.closed_by_psd;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    ::close(fd);
  }
}

void slow_http(int http_port, const std::atomic<bool>& stop, AttackCounts& n) {
  const std::string request = "GET /status.json HTTP/1.1\r\nHost: psd\r\nX-Slow: ";
  struct Slow {
    int fd;
    size_t at;
  };
  std::vector<Slow> conns;
  while (!stop) {
    for (auto it = conns.begin(); it != conns.end();) {
      const char c = it->at < request.size() ? request[it->at] : 'x';
      const bool gone = closed_by_peer(it->fd) || (::send(it->fd, &c, 1, MSG_NOSIGNAL) < 0 &&
                                                   errno != EAGAIN && errno != ENOTCONN);
      if (gone) {
        ++n.closed_by_psd;
        ::close(it->fd);
        it = conns.erase(it);
      } else {
        ++it->at;
        ++n.bytes_sent;
        ++it;
      }
    }
    while (conns.size() < 64) {
      const int fd = connect_from("127.0.0.6", http_port);
      if (fd < 0) break;
      ++n.connections;
      conns.push_back({fd, 0});
    }
    std::this_thread::sleep_for(200ms);
  }
  for (auto& c : conns) ::close(c.fd);
}

// --- The legitimate workers ---

enum Phase { kCalm = 0, kAttack = 1, kStop = 2, kStarting = 3 };

struct PhaseFigures {
  std::mutex mu;
  std::vector<double> call_ms;  // every pull and push
  uint64_t pushes = 0;
  void add(double ms) {
    std::lock_guard lock(mu);
    call_ms.push_back(ms);
  }
};

struct WorkerResult {
  uint64_t pushes = 0;
  std::string error;
};

void train(int worker, int port, uint64_t floats_per_tensor, const std::atomic<int>& phase,
           std::atomic<int>& ready, PhaseFigures* figures, WorkerResult& out) {
  try {
    ps::ClientOptions o;
    o.ps_hosts = {"127.0.0.1:" + std::to_string(port)};
    o.worker_index = worker;
    o.call_timeout = 30s;
    ps::Client client(o);
    std::vector<ps::TensorSpec> specs;
    std::vector<std::string> names;
    for (int i = 0; i < 4; ++i) {
      specs.push_back({.name = "soak/t" + std::to_string(i),
                       .shape = {floats_per_tensor},
                       .optimizer = ps::OptimizerConfig::sgd(1.0f),
                       .init = ps::InitConfig::constant(0)});
      names.push_back(specs.back().name);
    }
    client.create(specs);  // the same specs from every worker: created once
    std::vector<std::vector<float>> values(4, std::vector<float>(floats_per_tensor));
    const std::vector<float> grad(floats_per_tensor, -1.0f);  // SGD at 1: +1 per push
    std::vector<std::span<float>> into;
    std::vector<std::span<const float>> grads;
    for (int i = 0; i < 4; ++i) {
      into.emplace_back(values[i]);
      grads.emplace_back(grad);
    }
    ++ready;
    while (phase.load() == kStarting) std::this_thread::sleep_for(1ms);
    for (;;) {
      const int p = phase.load();
      if (p == kStop) break;
      auto t0 = Clock::now();
      client.pull(names, into);
      auto t1 = Clock::now();
      client.push(names, grads, 0);
      auto t2 = Clock::now();
      ++out.pushes;
      PhaseFigures& f = figures[p];
      f.add(std::chrono::duration<double, std::milli>(t1 - t0).count());
      f.add(std::chrono::duration<double, std::milli>(t2 - t1).count());
      std::lock_guard lock(f.mu);
      ++f.pushes;
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attack_soak: 1 psd + 3 workers training, calm and then under attack"};
  std::string psd_binary;
  double seconds = 40;
  int max_memory_mb = 128;
  double slowest_ms = 3000;
  double model_mb = 1;
  app.add_option("--psd", psd_binary, "psd to start")->required();
  app.add_option("--seconds", seconds, "length of each phase (calm, then attack)");
  app.add_option("--max_memory_mb", max_memory_mb, "psd's memory budget; its RSS must stay under");
  app.add_option("--slowest_ms", slowest_ms, "bound on a worker's slowest call under attack");
  app.add_option("--model_mb", model_mb, "model size, MiB (4 tensors)");
  bool keep_log = false;
  app.add_flag("--keep_log", keep_log, "keep psd's log (it is kept anyway on failure)");
  PS_PARSE_FLAGS(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);

  char dir_template[] = "/tmp/attack-soak-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  Psd psd = start_psd(psd_binary, dir, max_memory_mb);
  if (psd.pid <= 0 || psd.port == 0 || psd.http_port == 0) {
    std::fprintf(stderr, "psd did not start (log: %s/psd.log)\n", dir.c_str());
    if (psd.pid > 0) kill(psd.pid, SIGKILL);
    return 1;
  }
  std::printf("psd pid %d on 127.0.0.1:%d (HTTP %d), --max_memory_mb %d; %g s calm, %g s attack\n",
              psd.pid, psd.port, psd.http_port, max_memory_mb, seconds, seconds);

  // RSS and liveness, sampled until the end.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> peak_kib[2] = {0, 0};
  std::atomic<int> phase{kStarting};
  std::atomic<bool> psd_died{false};
  std::thread watcher([&] {
    while (!done) {
      if (!alive(psd.pid)) {
        psd_died = true;
        return;
      }
      const uint64_t r = rss_kib(psd.pid);
      auto& peak = peak_kib[phase.load() == kAttack || phase.load() == kStop ? 1 : 0];
      if (r > peak) peak = r;
      std::this_thread::sleep_for(50ms);
    }
  });

  const uint64_t floats =
      std::max<uint64_t>(1, static_cast<uint64_t>(model_mb * (1 << 20) / 4 / sizeof(float)));
  PhaseFigures figures[2];
  WorkerResult results[3];
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back(train, w, psd.port, floats, std::cref(phase), std::ref(ready), figures,
                         std::ref(results[w]));
  }
  // The clock starts once every worker has connected and created the model.
  const auto start_deadline = Clock::now() + 30s;
  while (ready.load() < 3 && Clock::now() < start_deadline) std::this_thread::sleep_for(5ms);
  phase = kCalm;
  const auto calm_start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double calm_s = std::chrono::duration<double>(Clock::now() - calm_start).count();

  std::atomic<bool> stop_attack{false};
  AttackCounts counts[5];
  std::vector<std::thread> attackers;
  attackers.emplace_back(flood_refused_calls, psd.port, std::cref(stop_attack),
                         std::ref(counts[0]));
  attackers.emplace_back(idle_without_hello, psd.port, std::cref(stop_attack), std::ref(counts[1]));
  attackers.emplace_back(unread_replies, psd.port, std::cref(stop_attack), std::ref(counts[2]));
  attackers.emplace_back(large_before_hello, psd.port, std::cref(stop_attack), std::ref(counts[3]));
  attackers.emplace_back(slow_http, psd.http_port, std::cref(stop_attack), std::ref(counts[4]));
  phase = kAttack;
  const auto attack_start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  phase = kStop;
  const double attack_s = std::chrono::duration<double>(Clock::now() - attack_start).count();
  for (auto& w : workers) w.join();
  stop_attack = true;
  for (auto& a : attackers) a.join();

  // Every value must be the number of pushes made, all workers together.
  bool ok = true;
  uint64_t pushes = 0;
  for (int w = 0; w < 3; ++w) {
    pushes += results[w].pushes;
    if (!results[w].error.empty()) {
      std::printf("FAIL: worker %d: %s\n", w, results[w].error.c_str());
      ok = false;
    }
  }
  if (!psd_died) {
    try {
      ps::ClientOptions o;
      o.ps_hosts = {"127.0.0.1:" + std::to_string(psd.port)};
      ps::Client check(o);
      for (int i = 0; i < 4; ++i) {
        const std::string name = "soak/t" + std::to_string(i);
        check.declare({{.name = name, .shape = {floats}}});
        const std::vector<float> v = check.pull(name);
        const auto bad = std::find_if(v.begin(), v.end(),
                                      [&](float x) { return x != static_cast<float>(pushes); });
        if (bad != v.end()) {
          std::printf("FAIL: %s[%zu] = %g, expected %llu (the pushes made)\n", name.c_str(),
                      static_cast<size_t>(bad - v.begin()), static_cast<double>(*bad),
                      static_cast<unsigned long long>(pushes));
          ok = false;
        }
      }
    } catch (const std::exception& e) {
      std::printf("FAIL: reading the model back: %s\n", e.what());
      ok = false;
    }
  }
  done = true;
  watcher.join();

  const double calm_rate = static_cast<double>(figures[0].pushes) / calm_s;
  const double attack_rate = static_cast<double>(figures[1].pushes) / attack_s;
  const double slowest_calm = percentile(figures[0].call_ms, 1.0);
  const double slowest_attack = percentile(figures[1].call_ms, 1.0);
  std::printf(
      "pushes (all 3 workers): calm %.1f/s, under attack %.1f/s (%.0f%%); values exact: %s\n",
      calm_rate, attack_rate, calm_rate > 0 ? 100 * attack_rate / calm_rate : 0.0,
      ok ? "yes" : "no");
  std::printf(
      "worker calls: calm p50 %.1f ms p99 %.1f ms slowest %.1f ms; "
      "under attack p50 %.1f ms p99 %.1f ms slowest %.1f ms (bound %.0f ms)\n",
      percentile(figures[0].call_ms, 0.5), percentile(figures[0].call_ms, 0.99), slowest_calm,
      percentile(figures[1].call_ms, 0.5), percentile(figures[1].call_ms, 0.99), slowest_attack,
      slowest_ms);
  std::printf("psd VmRSS peak: calm %.1f MiB, under attack %.1f MiB (budget %d MiB)\n",
              static_cast<double>(peak_kib[0]) / 1024, static_cast<double>(peak_kib[1]) / 1024,
              max_memory_mb);
  const char* names[5] = {"flood", "idle", "unread", "large", "slow_http"};
  for (int i = 0; i < 5; ++i) {
    std::printf("attack %-9s connections %6llu, closed by psd %6llu, bytes sent %llu\n", names[i],
                static_cast<unsigned long long>(counts[i].connections.load()),
                static_cast<unsigned long long>(counts[i].closed_by_psd.load()),
                static_cast<unsigned long long>(counts[i].bytes_sent.load()));
  }

  if (psd_died || !alive(psd.pid)) {
    std::printf("FAIL: psd exited (log: %s/psd.log)\n", dir.c_str());
    ok = false;
  }
  if (peak_kib[1] > static_cast<uint64_t>(max_memory_mb) * 1024 ||
      peak_kib[0] > static_cast<uint64_t>(max_memory_mb) * 1024) {
    std::printf("FAIL: psd's RSS passed its --max_memory_mb\n");
    ok = false;
  }
  if (slowest_attack > slowest_ms) {
    std::printf("FAIL: a worker's call took %.0f ms under attack (bound %.0f)\n", slowest_attack,
                slowest_ms);
    ok = false;
  }
  if (figures[1].pushes == 0) {
    std::printf("FAIL: no training under attack\n");
    ok = false;
  }
  if (alive(psd.pid)) {
    kill(psd.pid, SIGTERM);
    int status = 0;
    waitpid(psd.pid, &status, 0);
  }
  if (ok && !keep_log) {
    std::filesystem::remove_all(dir);
  } else {
    std::printf("psd's log kept in %s/psd.log\n", dir.c_str());
  }
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
