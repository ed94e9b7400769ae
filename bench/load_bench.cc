// Sustained load on psds you started: N clients, each on a thread of its
// own, push (or pull) a tensor of their own back to back for a while; the
// aggregate rate and each client's latency spread. Where push_pull_bench
// measures one psd it starts against plain TCP, this shows how a running
// setup behaves over seconds: several psds (one client per psd, or every
// tensor spread over all), and runs that are slow throughout rather than
// in bursts (docs/performance.md, "Busy polling").
//
//   build/server/psd --port 2222 &
//   build/bench/load_bench --ps_hosts 127.0.0.1:2222 --clients 3 --size_kb 4096 --seconds 3
//   build/bench/load_bench --ps_hosts h:2222,h:2223,h:2224 --clients 3 --spread one_psd_each
//   build/bench/load_bench --ps_hosts h:2222,h:2223,h:2224 --clients 3 --chunk_kb 1024 --op pull
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/trainer_flags.h"

namespace {

using Clock = std::chrono::steady_clock;

struct ClientResult {
  std::vector<double> latency_us;
  std::string error;
  Clock::time_point begin, finish;  // of its first call and its last
};

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1,
                         static_cast<size_t>(q * static_cast<double>(sorted.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "load_bench: N clients pushing or pulling their own tensor back to back against running "
      "psds"};
  std::string ps_hosts = "127.0.0.1:2222";
  int clients = 1;
  size_t size_kb = 1024;
  double seconds = 3;
  std::string op = "push";
  std::string spread = "all";
  size_t chunk_kb = ps::kDefaultChunkBytes >> 10;
  bool shared_memory = true;
  app.add_option("--ps_hosts", ps_hosts, "the psds, comma-separated host:port (shards of one job)")
      ->capture_default_str();
  app.add_option("--clients", clients, "client threads, each with a Client and a tensor of its own")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--size_kb", size_kb, "tensor size in KiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--seconds", seconds, "how long each client keeps going")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--op", op, "push or pull")
      ->check(CLI::IsMember({"push", "pull"}))
      ->capture_default_str();
  app.add_option("--spread", spread,
                 "all: every client talks to every psd (tensors placed and chunked as usual); "
                 "one_psd_each: client i "
                 "talks only to psd i mod N, a single-shard job of its own (psds started without "
                 "--shard_index)")
      ->check(CLI::IsMember({"all", "one_psd_each"}))
      ->capture_default_str();
  app.add_option("--chunk_kb", chunk_kb, "ClientOptions::chunk_bytes, in KiB")
      ->capture_default_str();
  app.add_option("--shared_memory", shared_memory, "let clients on psd's host use shared memory")
      ->capture_default_str();
  PS_PARSE_FLAGS(app, argc, argv);

  const std::vector<std::string> hosts = ps::split_list(ps_hosts);
  const size_t floats = (size_kb << 10) / sizeof(float);
  std::vector<ClientResult> results(static_cast<size_t>(clients));
  std::barrier start(clients + 1);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      ClientResult& out = results[static_cast<size_t>(c)];
      std::vector<float> values(floats, 0.0f);
      bool started = false;
      try {
        ps::ClientOptions o;
        o.ps_hosts = spread == "all"
                         ? hosts
                         : std::vector<std::string>{hosts[static_cast<size_t>(c) % hosts.size()]};
        o.chunk_bytes = chunk_kb << 10;
        if (!shared_memory) o.shared_memory_bytes = 0;
        ps::Client client(o);
        const std::string name =
            "load_bench/c" + std::to_string(c) + "_" + std::to_string(size_kb) + "k";
        // Learning rate 0: the values stay zero however many pushes land.
        client.create(
            {{.name = name, .shape = {floats}, .optimizer = ps::OptimizerConfig::sgd(0.0f)}});
        start.arrive_and_wait();
        started = true;
        out.begin = Clock::now();
        const auto end = out.begin + std::chrono::duration<double>(seconds);
        for (auto t0 = out.begin; t0 < end;) {
          if (op == "push") {
            client.push(name, values);
          } else {
            client.pull(name, values);
          }
          const auto t1 = Clock::now();
          out.latency_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          t0 = t1;
        }
        out.finish = Clock::now();
      } catch (const std::exception& e) {
        out.error = e.what();
        failed = true;
        if (!started) start.arrive_and_drop();  // the others go without it
        return;
      }
    });
  }
  start.arrive_and_wait();
  for (auto& t : threads) t.join();

  // The rate over the time from the first client's first call to the last
  // call's end: each client's last call ends past --seconds.
  size_t total = 0;
  std::optional<Clock::time_point> begin, finish;
  for (int c = 0; c < clients; ++c) {
    ClientResult& r = results[static_cast<size_t>(c)];
    if (!r.error.empty()) {
      std::fprintf(stderr, "load_bench: client %d: %s\n", c, r.error.c_str());
      continue;
    }
    std::sort(r.latency_us.begin(), r.latency_us.end());
    total += r.latency_us.size();
    begin = begin ? std::min(*begin, r.begin) : r.begin;
    finish = finish ? std::max(*finish, r.finish) : r.finish;
    std::printf("client %d: %zu %s, latency us p10 %.0f p50 %.0f p90 %.0f p99 %.0f max %.0f\n", c,
                r.latency_us.size(), op == "push" ? "pushes" : "pulls",
                percentile(r.latency_us, 0.1), percentile(r.latency_us, 0.5),
                percentile(r.latency_us, 0.9), percentile(r.latency_us, 0.99),
                r.latency_us.empty() ? 0.0 : r.latency_us.back());
  }
  std::printf("%d client%s, %zu KiB %s, %s: %.2f GB/s together\n", clients, clients == 1 ? "" : "s",
              size_kb, op.c_str(), spread == "all" ? "every client to every psd" : "one psd each",
              begin ? static_cast<double>(total) * static_cast<double>(floats * sizeof(float)) /
                          std::chrono::duration<double>(*finish - *begin).count() / 1e9
                    : 0.0);
  return failed ? 1 : 0;
}
