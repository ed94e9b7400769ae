// Embedding-table pull and push rates against a real psd, each printed next
// to what the machine itself does in the same run: gathering and
// scatter-adding the same random rows in memory on one core (the physical
// limit of a shard's work), and plain loopback TCP bytes/s.
//
//   build/bench/embedding_bench                    # 10^7 x 32 and 5*10^6 x 64 fixed SGD tables
//   build/bench/embedding_bench --clients 3 --dynamic_rows 1000000
//   build/bench/embedding_bench --same_host false   # TCP lines only
//   build/bench/embedding_bench --in_flight 2       # two calls at once per client
//   build/bench/embedding_bench --table_threads 4   # psd spreads a request over 4 threads
//   build/bench/embedding_bench --dynamic_rows 1000000 --min_count 2   # admission by count
//   build/bench/embedding_bench --dynamic_rows 1000000 --expire_after_steps 1000   # rows that
//   expire
//
// Each fixed table is measured with 65,536-id batches; pull and push rates
// are given as a share of the in-memory gather rate of the same row size,
// measured again just before and just after each of them (--reps batches
// each time, the median of both), so that a machine that slows down or
// speeds up during the run moves both figures alike. Not batch by batch:
// a gather right after a call to psd runs with the TLB and caches that
// call left, slower than the machine can gather.
// Beside them, psd's own table code (server/embedding) in this process, on
// one thread and on several: what --table_threads gains where cores are free.
// Ids are uniform over the rows, or skewed (id = rows * u^3: a hot head, so
// a batch has many repeated ids, which the client sends once). Reported:
// medians over --reps batches, rows/s and payload GB/s (rows * dim * 4 bytes),
// client-side dedup + split + reassembly time of one batch, and psd's RSS
// against the table's raw bytes.
// The TCP lines' clients reach psd over loopback TCP, as from another host;
// beside each of them plain loopback TCP is measured too (a batch's row
// bytes as one message, just before and just after, the mean of both), and
// the rows' GB/s given as a share of it: what the socket alone carries;
// the same-host lines' over psd's Unix socket, with and without shared memory.
// One program, so that psd, the in-memory limits and plain TCP are measured
// in the same run, in turn, under the same load.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_psd.h"
#include "client/row_plan.h"
#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "server/compute_pool.h"
#include "server/embedding/embedding_table.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The benchmark's psd (bench/bench_psd.h), and what it reports of its memory.
// A Unix socket too, for the same-host lines; the TCP lines' clients do not
// switch to it (ClientOptions::prefer_unix_socket = false).
struct Psd : ps::bench::BenchPsd {
  Psd(const std::string& binary, const std::string& unix_socket, unsigned busy_poll_us,
      unsigned table_threads)
      : BenchPsd(binary, flags(unix_socket, busy_poll_us, table_threads), "psd-emb-bench") {}
  static std::vector<std::string> flags(const std::string& unix_socket, unsigned busy_poll_us,
                                        unsigned table_threads) {
    std::vector<std::string> f{"--max_memory_mb", "16384",          "--unix_socket",
                               unix_socket,       "--busy_poll_us", std::to_string(busy_poll_us)};
    if (table_threads > 0) f.insert(f.end(), {"--table_threads", std::to_string(table_threads)});
    return f;
  }
  // Of its memory, how much is in 2 MiB pages (transparent huge pages).
  uint64_t huge_page_bytes() const {
    std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
    std::string key;
    uint64_t kb = 0;
    while (in >> key) {
      if (key == "AnonHugePages:") {
        in >> kb;
        break;
      }
    }
    return kb * 1024;
  }
  uint64_t rss_bytes() const {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string key;
    uint64_t kb = 0;
    while (in >> key) {
      if (key == "VmRSS:") {
        in >> kb;
        break;
      }
    }
    return kb * 1024;
  }
};

std::vector<std::vector<int64_t>> make_batches(uint64_t rows, std::size_t batch, int count,
                                               bool skewed, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::vector<int64_t>> out(count, std::vector<int64_t>(batch));
  for (auto& b : out) {
    for (auto& id : b) {
      const double x = u(rng);
      id = static_cast<int64_t>(
          std::min<double>(double(rows) * (skewed ? x * x * x : x), double(rows - 1)));
    }
  }
  return out;
}

// In memory, one core: out[i] = table[ids[i]], and table[ids[i]] += g[i].
__attribute__((noinline)) void gather(const float* table, const int64_t* ids, std::size_t n,
                                      uint32_t dim, float* out) {
  for (std::size_t i = 0; i < n; ++i)
    std::memcpy(out + i * dim, table + std::size_t(ids[i]) * dim, dim * sizeof(float));
}
__attribute__((noinline)) void scatter_add(float* table, const int64_t* ids, std::size_t n,
                                           uint32_t dim, const float* g) {
  for (std::size_t i = 0; i < n; ++i) {
    float* __restrict row = table + std::size_t(ids[i]) * dim;
    const float* __restrict gi = g + i * dim;
    for (uint32_t j = 0; j < dim; ++j) row[j] -= 0.01f * gi[j];
  }
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) throw std::runtime_error("write failed");
    p += w;
    n -= std::size_t(w);
  }
}
void read_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) throw std::runtime_error("read failed");
    p += r;
    n -= std::size_t(r);
  }
}

// Plain loopback TCP: median bytes/s of "send `bytes`, get a 1-byte ack".
double tcp_bytes_per_second(std::size_t bytes, int reps) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      listen(listener, 1) != 0) {
    throw std::runtime_error("cannot listen on loopback");
  }
  std::thread receiver([&] {
    const int fd = accept(listener, nullptr, nullptr);
    std::vector<char> buf(bytes);
    char ack = 1;
    for (int i = 0; i < reps + 2; ++i) {
      read_all(fd, buf.data(), bytes);
      write_all(fd, &ack, 1);
    }
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    throw std::runtime_error("connect failed");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> buf(bytes, 'x');
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) {
    const auto t0 = Clock::now();
    write_all(fd, buf.data(), bytes);
    char ack;
    read_all(fd, &ack, 1);
    if (i >= 2) t.push_back(seconds_since(t0));
  }
  close(fd);
  receiver.join();
  close(listener);
  return double(bytes) / median(t);
}

// CPU time (all threads, user + system) of this process, and of psd from
// its threads' schedstat: with the machine shared, wall-clock rates swing
// with other load, while CPU time per batch says what the work costs.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}
double self_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}
double process_cpu_seconds(pid_t pid) {
  double total = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream in(task.path() / "schedstat");
    uint64_t ns = 0;
    if (in >> ns) total += double(ns) / 1e9;
  }
  return total;
}

struct Rate {
  double rows_per_s = 0;
  double gb_per_s = 0;
  double client_cpu_ms = 0;  // per batch, all clients
  double psd_cpu_ms = 0;
  double gather_rows_per_s = 0;  // the in-memory gather measured with it
  double tcp_bytes_per_s = 0;    // over TCP: plain loopback TCP measured with it (0: not)
};

Rate rate(std::size_t rows, uint32_t dim, double secs) {
  return {double(rows) / secs, double(rows) * dim * sizeof(float) / secs / 1e9};
}

void print(const char* what, Rate r) {
  std::printf(
      "  %-34s %8.2f M rows/s  %6.2f GB/s  (%.2f of gather)  cpu/batch: client %.2f ms, psd %.2f "
      "ms  gather %.2f M rows/s",
      what, r.rows_per_s / 1e6, r.gb_per_s, r.rows_per_s / r.gather_rows_per_s, r.client_cpu_ms,
      r.psd_cpu_ms, r.gather_rows_per_s / 1e6);
  // The rows' bytes against what loopback TCP alone carries (ids and
  // framing not counted): the share of the socket's own limit.
  if (r.tcp_bytes_per_s > 0)
    std::printf("  TCP %.2f GB/s (%.2f of it)", r.tcp_bytes_per_s / 1e9,
                r.gb_per_s * 1e9 / r.tcp_bytes_per_s);
  std::printf("\n");
}

// A copy of a fixed table in memory, in 2 MiB pages (transparent huge pages,
// as psd's fixed tables), kept while psd's copy is measured: the in-memory
// gather of uniform ids from it is measured beside every psd figure.
class MemoryTable {
 public:
  MemoryTable(uint64_t rows, uint32_t dim, std::vector<std::vector<int64_t>> uniform,
              std::size_t batch)
      : bytes_(rows * dim * sizeof(float)),
        dim_(dim),
        uniform_(std::move(uniform)),
        out_(batch * dim) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    madvise(p, bytes_, MADV_HUGEPAGE);
    rows_ = static_cast<float*>(p);
    std::fill_n(rows_, rows * dim, 0.5f);
  }
  ~MemoryTable() { munmap(rows_, bytes_); }
  MemoryTable(const MemoryTable&) = delete;
  MemoryTable& operator=(const MemoryTable&) = delete;

  float* rows() { return rows_; }
  // Seconds to gather the k-th batch of uniform ids (wrapping around).
  double gather_seconds(std::size_t k) {
    const auto& ids = uniform_[k % uniform_.size()];
    const auto t0 = Clock::now();
    gather(rows_, ids.data(), ids.size(), dim_, out_.data());
    return seconds_since(t0);
  }
  std::size_t batch() const { return out_.size() / dim_; }

 private:
  std::size_t bytes_;
  uint32_t dim_;
  std::vector<std::vector<int64_t>> uniform_;
  std::vector<float> out_;
  float* rows_ = nullptr;
};

}  // namespace

// psd's own table code (server/embedding), in this process: a push then a
// pull of each batch, on one thread and spread over `threads` (psd
// --table_threads; 0: every core), the two tables taking turns batch by
// batch. A dynamic table's rows are created first by a pull of `fill` (by
// min_count pushes of zeros where the table admits ids by count).
struct TableCodeRates {
  unsigned threads = 1;
  Rate push[2], pull[2];  // [0]: one thread
  void print() const {
    std::printf(
        "  psd's table code in memory: push %6.2f M rows/s on 1 thread, %6.2f on %u (%.2fx); "
        "pull %6.2f, %6.2f (%.2fx)\n",
        push[0].rows_per_s / 1e6, push[1].rows_per_s / 1e6, threads,
        push[1].rows_per_s / push[0].rows_per_s, pull[0].rows_per_s / 1e6, pull[1].rows_per_s / 1e6,
        pull[1].rows_per_s / pull[0].rows_per_s);
  }
};

TableCodeRates psd_table_code(const ps::TableSpec& spec,
                              const std::vector<std::vector<int64_t>>& batches, unsigned threads,
                              const std::vector<int64_t>& fill = {}) {
  TableCodeRates r;
  r.threads = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  const std::size_t batch = batches.at(0).size();
  auto as_ids = [](const std::vector<int64_t>& ids) {
    return std::span<const uint64_t>(reinterpret_cast<const uint64_t*>(ids.data()), ids.size());
  };
  ps::ComputePool pool(r.threads - 1);
  const unsigned helpers = r.threads - 1;
  ps::EmbeddingTable one(spec, 0, 1),
      spread(spec, 0, 1, ps::RunParts{r.threads, [&](std::size_t parts, const ps::PartFn&fn) {
                                        pool.run_parts(parts, helpers, fn);
                                      }});
  std::vector<float> out(batch * spec.dim), grads(batch * spec.dim, 0.25f);
  const std::vector<float> zeros(batch * spec.dim, 0.0f);
  using Creating = ps::EmbeddingTable::Creating;
  for (std::size_t first = 0; first < fill.size(); first += batch) {
    const std::vector<int64_t> part(fill.begin() + first,
                                    fill.begin() + std::min(fill.size(), first + batch));
    for (ps::EmbeddingTable* t : {&one, &spread}) {
      if (!t->admits_by_count()) {
        t->check(as_ids(part), "fill");
        t->pull(as_ids(part), out.data());
        continue;
      }
      for (uint32_t k = 0; k < spec.min_count; ++k) {
        t->check(as_ids(part), "fill", Creating::kByPush);
        t->push(as_ids(part), std::span<const float>(zeros).first(part.size() * spec.dim), 1.0f);
      }
    }
  }
  std::vector<double> push_s[2], pull_s[2];
  for (const auto& ids : batches) {
    for (int k = 0; k < 2; ++k) {
      ps::EmbeddingTable& t = k ? spread : one;
      t.check(as_ids(ids), "push", Creating::kByPush);
      auto t0 = Clock::now();
      t.push(as_ids(ids), grads, 1.0f);
      push_s[k].push_back(seconds_since(t0));
      t0 = Clock::now();
      t.pull(as_ids(ids), out.data());
      pull_s[k].push_back(seconds_since(t0));
    }
  }
  for (int k = 0; k < 2; ++k) {
    r.push[k] = rate(batch, spec.dim, median(push_s[k]));
    r.pull[k] = rate(batch, spec.dim, median(pull_s[k]));
  }
  return r;
}

int main(int argc, char** argv) {
  CLI::App app{"Embedding-table pull/push rates against psd, with in-memory and TCP references"};
  std::string psd_binary =
      (std::filesystem::path(argv[0]).parent_path() / "../server/psd").string();
  uint64_t rows = 10'000'000;
  uint32_t dim = 32;
  std::size_t batch = 65536;
  int reps = 11;
  int clients = 1;
  uint64_t wide_rows = 5'000'000;
  uint32_t wide_dim = 64;
  uint64_t dynamic_rows = 0;
  uint32_t min_count = 0;
  uint64_t expire_after_steps = 0;
  std::size_t request_kb = 1024;
  unsigned busy_poll_us = 50;
  app.add_option("--psd", psd_binary, "psd binary to start")->capture_default_str();
  app.add_option("--rows", rows, "rows of the fixed table")->capture_default_str();
  app.add_option("--dim", dim, "floats per row")->capture_default_str();
  app.add_option("--batch", batch, "ids per pull or push")->capture_default_str();
  app.add_option("--reps", reps, "batches per measurement (median reported)")
      ->capture_default_str();
  app.add_option("--clients", clients,
                 "clients pulling and pushing at once (each its own connection)")
      ->capture_default_str();
  app.add_option("--wide_rows", wide_rows,
                 "also a second fixed table of this many rows of --wide_dim floats (0: none)")
      ->capture_default_str();
  app.add_option("--wide_dim", wide_dim, "floats per row of the second fixed table")
      ->capture_default_str();
  app.add_option("--dynamic_rows", dynamic_rows,
                 "also a dynamic table filled with this many rows (0: none)")
      ->capture_default_str();
  app.add_option("--min_count", min_count,
                 "the dynamic table admits ids at their Nth push (TableSpec::min_count); it is "
                 "filled by N pushes of zeros")
      ->capture_default_str();
  app.add_option("--expire_after_steps", expire_after_steps,
                 "the dynamic table's rows expire (TableSpec::expire_after_steps): each touch "
                 "keeps its LRU order and step; no step passes in the run, so none expires")
      ->capture_default_str();
  app.add_option("--request_kb", request_kb, "ClientOptions::max_request_bytes, KiB")
      ->capture_default_str();
  int in_flight = 1;
  app.add_option("--in_flight", in_flight,
                 "calls each client keeps going at once (pull_rows_async / push_rows_async), as a "
                 "trainer that fetches the next batch's rows during a step; above 1, rates are "
                 "rows over the wall time, not medians")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  bool same_host = true;
  app.add_option("--same_host", same_host,
                 "also measure fixed tables' uniform pull and push over psd's Unix socket, with "
                 "shared memory (ClientOptions::shared_memory_bytes) and without")
      ->capture_default_str();
  app.add_option("--busy_poll_us", busy_poll_us,
                 "psd's --busy_poll_us and the clients' ClientOptions::busy_poll (0: no polling, "
                 "so that CPU per batch is the work alone)")
      ->capture_default_str();
  unsigned table_threads = 0;
  app.add_option("--table_threads", table_threads,
                 "psd's --table_threads (0: psd's default); the in-memory line of psd's table "
                 "code compares this many threads (0: every core) with one")
      ->capture_default_str();
  PS_PARSE_FLAGS(app, argc, argv);

  const std::string sock = (std::filesystem::temp_directory_path() /
                            ("psd-emb-bench-" + std::to_string(getpid()) + ".sock"))
                               .string();
  Psd psd(psd_binary, sock, busy_poll_us, table_threads);
  const std::string address = "127.0.0.1:" + std::to_string(psd.port);
  ps::ClientOptions o;
  o.ps_hosts = {address};
  o.max_request_bytes = request_kb << 10;
  o.prefer_unix_socket = false;  // TCP, as a client on another host
  o.shared_memory_bytes = 0;
  o.busy_poll = std::chrono::microseconds(busy_poll_us);
  std::vector<std::unique_ptr<ps::Client>> cs;
  for (int c = 0; c < clients; ++c) cs.push_back(std::make_unique<ps::Client>(o));
  // The same-host path: psd's Unix socket, with shared memory (the
  // default) or without.
  std::vector<std::unique_ptr<ps::Client>> shm, local;
  if (same_host) {
    ps::ClientOptions l = o;
    l.ps_hosts = {"unix:" + sock};
    for (int c = 0; c < clients; ++c) local.push_back(std::make_unique<ps::Client>(l));
    l.shared_memory_bytes = ps::ClientOptions{}.shared_memory_bytes;
    for (int c = 0; c < clients; ++c) shm.push_back(std::make_unique<ps::Client>(l));
  }

  // Each client runs its batches; the rate counts every client's rows over the wall time.
  auto measure_with = [&](std::vector<std::unique_ptr<ps::Client>>& cs, const std::string& table,
                          uint32_t dim, const std::vector<std::vector<int64_t>>& batches, bool push,
                          MemoryTable& memory, bool over_tcp) {
    std::vector<std::vector<double>> times(clients);
    std::vector<double> gathers;  // the in-memory reference, just before and just after
    std::vector<double> tcp;      // loopback TCP of a batch's row bytes, likewise (over TCP)
    auto reference = [&] {
      for (std::size_t k = 0; k < batches.size(); ++k) gathers.push_back(memory.gather_seconds(k));
      if (over_tcp) tcp.push_back(tcp_bytes_per_second(batch * dim * sizeof(float), 5));
    };
    reference();
    std::vector<std::thread> threads;
    const double client0 = self_cpu_seconds(), psd0 = process_cpu_seconds(psd.pid);
    const auto t0 = Clock::now();
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        if (in_flight == 1) {
          std::vector<float> buf(batch * dim, 0.001f);
          for (const auto& ids : batches) {
            const auto s = Clock::now();
            if (push)
              cs[c]->push_rows(table, ids, buf);
            else
              cs[c]->pull_rows(table, ids, buf);
            times[c].push_back(seconds_since(s));
          }
          return;
        }
        // A buffer per call in flight: call k reuses call k - in_flight's,
        // which has been waited for.
        std::vector<std::vector<float>> bufs(in_flight, std::vector<float>(batch * dim, 0.001f));
        std::deque<std::future<ps::PushStatus>> pushes;
        std::deque<std::future<int64_t>> pulls;
        for (std::size_t k = 0; k < batches.size(); ++k) {
          std::vector<float>& buf = bufs[k % in_flight];
          if (push) {
            if (pushes.size() == std::size_t(in_flight)) pushes.front().get(), pushes.pop_front();
            pushes.push_back(cs[c]->push_rows_async(table, batches[k], buf));
          } else {
            if (pulls.size() == std::size_t(in_flight)) pulls.front().get(), pulls.pop_front();
            pulls.push_back(cs[c]->pull_rows_async(table, batches[k], buf));
          }
        }
        for (auto& f : pushes) f.get();
        for (auto& f : pulls) f.get();
      });
    }
    for (auto& t : threads) t.join();
    const double wall = seconds_since(t0);
    const double batches_run = double(batches.size() * clients);
    Rate r = clients == 1 && in_flight == 1 ? rate(batch, dim, median(times[0]))
                                            : rate(batch * batches.size() * clients, dim, wall);
    r.client_cpu_ms = (self_cpu_seconds() - client0) / batches_run * 1e3;
    r.psd_cpu_ms = (process_cpu_seconds(psd.pid) - psd0) / batches_run * 1e3;
    reference();
    r.gather_rows_per_s = double(memory.batch()) / median(gathers);
    if (over_tcp) r.tcp_bytes_per_s = (tcp[0] + tcp[1]) / 2;
    return r;
  };
  auto measure = [&](const std::string& table, uint32_t dim,
                     const std::vector<std::vector<int64_t>>& batches, bool push,
                     MemoryTable& memory) {
    return measure_with(cs, table, dim, batches, push, memory, true);
  };

  // One fixed SGD table of rows x dim: the machine's references for that
  // row size (in-memory gather / scatter-add on one core, loopback TCP,
  // the client's own work on a batch), psd's RSS, then pull and push.
  auto fixed_table = [&](const std::string& name, uint64_t rows, uint32_t dim) {
    std::vector<float> table(rows * dim, 0.5f);
    auto uniform = make_batches(rows, batch, reps, false, 1);
    auto skewed = make_batches(rows, batch, reps, true, 2);
    std::vector<float> out(batch * dim), grads(batch * dim, 0.25f);
    std::vector<double> tg, ts;
    for (const auto& ids : uniform) {
      auto t0 = Clock::now();
      gather(table.data(), ids.data(), batch, dim, out.data());
      tg.push_back(seconds_since(t0));
      t0 = Clock::now();
      scatter_add(table.data(), ids.data(), batch, dim, grads.data());
      ts.push_back(seconds_since(t0));
    }
    table.clear();
    table.shrink_to_fit();
    // The same in 2 MiB pages, kept for the gathers measured beside psd's figures.
    auto memory = std::make_unique<MemoryTable>(rows, dim, uniform, batch);
    std::vector<double> tgh, tsh;
    for (std::size_t k = 0; k < uniform.size(); ++k) {
      tgh.push_back(memory->gather_seconds(k));
      const auto t0 = Clock::now();
      scatter_add(memory->rows(), uniform[k].data(), batch, dim, grads.data());
      tsh.push_back(seconds_since(t0));
    }
    const Rate mem_gather_4k = rate(batch, dim, median(tg)),
               mem_scatter_4k = rate(batch, dim, median(ts));
    const Rate mem_gather = rate(batch, dim, median(tgh)),
               mem_scatter = rate(batch, dim, median(tsh));
    const double tcp = tcp_bytes_per_second(batch * dim * sizeof(float), reps);
    // Client-side: dedup, split by shard and reassembly of one batch, as
    // pull_rows does it, for 1 shard (this benchmark's psd) and 3 shards
    // ('mod' placement): each reply's rows (here one reused buffer of a
    // request's size, as a reply just received is in cache) to their
    // positions, then the repeated ids. CPU time of this thread, so other
    // load on the machine does not count. Each pass over the batches is
    // taken twice and the median kept of all.
    const uint32_t per_request = uint32_t((request_kb << 10) / (dim * sizeof(float) + 8));
    std::vector<float> reply(std::size_t(per_request) * dim, 1.0f);
    ps::RowPlan plan;  // reused from batch to batch, as pull_rows's pool of plans does
    auto plan_cpu = [&](uint32_t shards) {
      std::vector<double> t;
      for (int pass = 0; pass < 2; ++pass) {
        for (const auto& ids : uniform) {
          const double t0 = thread_cpu_seconds();
          ps::plan_rows_into(
              plan,
              std::span<const uint64_t>(reinterpret_cast<const uint64_t*>(ids.data()), ids.size()),
              ps::RowPlacement(ps::TablePlacement::kMod, rows, shards), per_request, false);
          for (const auto& r : plan.requests)
            ps::scatter_request(plan, r, reply.data(), dim, out.data());
          ps::fill_repeats(plan, dim, out.data());
          t.push_back(thread_cpu_seconds() - t0);
        }
      }
      return median(t);
    };
    const double plan_1 = plan_cpu(1), plan_3 = plan_cpu(3);
    const TableCodeRates table_code =
        psd_table_code(ps::TableSpec{.name = name,
                                     .dim = dim,
                                     .rows = rows,
                                     .optimizer = ps::RowOptimizerConfig::sgd(0.01f)},
                       uniform, table_threads);
    std::printf(
        "embedding_bench: fixed table %llu x %u (SGD), batches of %zu ids, %d client(s), median "
        "of %d\n",
        (unsigned long long)rows, dim, batch, clients, reps);
    std::printf("  in-memory gather, one core        %8.2f M rows/s  %6.2f GB/s  (4 KiB pages)\n",
                mem_gather_4k.rows_per_s / 1e6, mem_gather_4k.gb_per_s);
    std::printf("  in-memory scatter-add, one core   %8.2f M rows/s  %6.2f GB/s  (4 KiB pages)\n",
                mem_scatter_4k.rows_per_s / 1e6, mem_scatter_4k.gb_per_s);
    std::printf("  in-memory gather, one core        %8.2f M rows/s  %6.2f GB/s  (2 MiB pages)\n",
                mem_gather.rows_per_s / 1e6, mem_gather.gb_per_s);
    std::printf("  in-memory scatter-add, one core   %8.2f M rows/s  %6.2f GB/s  (2 MiB pages)\n",
                mem_scatter.rows_per_s / 1e6, mem_scatter.gb_per_s);
    std::printf("  loopback TCP, %5.1f MB messages              %6.2f GB/s\n",
                batch * dim * 4 / 1e6, tcp / 1e9);
    std::printf(
        "  client dedup+split+reassembly     %8.3f ms CPU per batch (1 shard), %.3f ms (3 "
        "shards)\n",
        plan_1 * 1e3, plan_3 * 1e3);
    table_code.print();

    const ps::TableSpec spec{
        .name = name, .dim = dim, .rows = rows, .optimizer = ps::RowOptimizerConfig::sgd(0.01f)};
    const uint64_t rss0 = psd.rss_bytes();
    cs[0]->create_tables({spec});
    for (auto* group : {&cs, &shm, &local})
      for (auto& c : *group) c->declare_tables({spec});
    // Touch every row once so RSS counts the whole table.
    {
      std::vector<int64_t> ids(batch);
      std::vector<float> g(batch * dim, 0.0f);
      for (uint64_t first = 0; first < rows; first += batch) {
        const std::size_t n = std::min<uint64_t>(batch, rows - first);
        for (std::size_t i = 0; i < n; ++i) ids[i] = int64_t(first + i);
        cs[0]->push_rows(name, std::span<const int64_t>(ids.data(), n),
                         std::span<const float>(g.data(), n * dim));
      }
    }
    const uint64_t raw = rows * dim * sizeof(float);
    std::printf("  psd RSS for the table             %8.1f MB for %.1f MB raw (%.3fx)\n",
                (psd.rss_bytes() - rss0) / 1e6, raw / 1e6,
                double(psd.rss_bytes() - rss0) / double(raw));
    // Huge pages are advice: where the kernel has no free 2 MiB pages, the
    // table is in 4 KiB pages, and every random row costs a TLB miss more.
    std::printf("  psd memory in 2 MiB pages         %8.1f MB\n", psd.huge_page_bytes() / 1e6);

    print("pull, uniform ids", measure(name, dim, uniform, false, *memory));
    print("pull, skewed ids (rows * u^3)", measure(name, dim, skewed, false, *memory));
    print("push (SGD), uniform ids", measure(name, dim, uniform, true, *memory));
    print("push (SGD), skewed ids", measure(name, dim, skewed, true, *memory));
    if (same_host) {
      // psd's Unix socket with shared memory: each request's rows and
      // gradients through the connection's region, not the socket.
      const uint64_t shared0 = shm[0]->stats().at(0).shared_bytes;
      print("same host, shared memory: pull",
            measure_with(shm, name, dim, uniform, false, *memory, false));
      print("same host, shared memory: push",
            measure_with(shm, name, dim, uniform, true, *memory, false));
      const uint64_t shared1 = shm[0]->stats().at(0).shared_bytes;
      print("same host, Unix socket only: pull",
            measure_with(local, name, dim, uniform, false, *memory, false));
      print("same host, Unix socket only: push",
            measure_with(local, name, dim, uniform, true, *memory, false));
      std::printf("  through shared memory (psd's count)  %8.1f MB\n", (shared1 - shared0) / 1e6);
    }
  };
  fixed_table("fixed", rows, dim);
  if (wide_rows > 0) fixed_table("wide", wide_rows, wide_dim);

  if (dynamic_rows > 0) {
    const ps::TableSpec dyn{.name = "dyn",
                            .dim = dim,
                            .dynamic = true,
                            .placement = ps::TablePlacement::kHash,
                            .optimizer = ps::RowOptimizerConfig::sgd(0.01f),
                            .min_count = min_count,
                            .expire_after_steps = expire_after_steps};
    const uint64_t before = psd.rss_bytes();
    cs[0]->create_tables({dyn});
    for (auto& c : cs) c->declare_tables({dyn});
    std::vector<int64_t> ids(batch);
    std::vector<float> buf(batch * dim);
    const std::vector<float> zeros(batch * dim, 0.0f);
    for (uint64_t first = 0; first < dynamic_rows; first += batch) {
      const std::size_t n = std::min<uint64_t>(batch, dynamic_rows - first);
      for (std::size_t i = 0; i < n; ++i) ids[i] = int64_t((first + i) * 2654435761ull);
      const std::span<const int64_t> part(ids.data(), n);
      if (min_count <= 1) {
        cs[0]->pull_rows("dyn", part, std::span<float>(buf.data(), n * dim));
      } else {
        for (uint32_t k = 0; k < min_count; ++k)
          cs[0]->push_rows("dyn", part, std::span<const float>(zeros).first(n * dim));
      }
    }
    const uint64_t draw = dynamic_rows * dim * sizeof(float);
    std::printf("  dynamic table: %llu rows, psd RSS %8.1f MB for %.1f MB raw (%.3fx)\n",
                (unsigned long long)dynamic_rows, (psd.rss_bytes() - before) / 1e6, draw / 1e6,
                double(psd.rss_bytes() - before) / double(draw));
    // The ids' rows in order of creation, as the fill above made them: the
    // in-memory reference gathers those rows of a table of as many rows.
    auto dyn_batches = make_batches(dynamic_rows, batch, reps, false, 3);
    MemoryTable dyn_memory(dynamic_rows, dim, dyn_batches, batch);
    for (auto& b : dyn_batches) {
      for (auto& id : b) id = int64_t(uint64_t(id) * 2654435761ull);
    }
    std::vector<int64_t> fill(dynamic_rows);
    for (uint64_t i = 0; i < dynamic_rows; ++i) fill[i] = int64_t(i * 2654435761ull);
    psd_table_code(dyn, dyn_batches, table_threads, fill).print();
    print("dynamic pull, uniform ids", measure("dyn", dim, dyn_batches, false, dyn_memory));
    print("dynamic push (SGD), uniform ids", measure("dyn", dim, dyn_batches, true, dyn_memory));
  }
  return 0;
}
