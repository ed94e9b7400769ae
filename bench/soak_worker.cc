// A worker for bench/soak.sh: pulls and pushes a ~1 MB model (4 tensors,
// Adam) in a loop for --seconds, then prints what it did. Async mode: every
// worker creates the model (idempotent) and trains without waiting for the
// others, which is what keeps psd busiest.
#include <chrono>
#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/trainer_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"soak_worker: pull/push a ~1 MB model against psd for a given time"};
  std::string hosts;
  int worker = 0;
  double seconds = 60, model_mb = 1;
  app.add_option("--ps_hosts", hosts, "comma-separated psd addresses")->required();
  app.add_option("--worker", worker, "this worker's index");
  app.add_option("--seconds", seconds, "how long to run");
  app.add_option("--model_mb", model_mb, "model size, MiB (4 tensors)");
  PS_PARSE_FLAGS(app, argc, argv);
  try {
    ps::ClientOptions o;
    o.ps_hosts = ps::split_list(hosts);
    ps::Client client(o);
    const uint64_t n =
        std::max<uint64_t>(1, static_cast<uint64_t>(model_mb * (1 << 20) / 4 / sizeof(float)));
    std::vector<ps::TensorSpec> specs;
    std::vector<std::string> names;
    for (int i = 0; i < 4; ++i) {
      specs.push_back({.name = "soak/t" + std::to_string(i),
                       .shape = {n},
                       .optimizer = ps::OptimizerConfig::adam(1e-4f),
                       .init = ps::InitConfig::uniform(-0.1f, 0.1f, 42 + i)});
      names.push_back(specs.back().name);
    }
    client.create(specs);
    std::vector<std::vector<float>> values(4, std::vector<float>(n)),
        grads(4, std::vector<float>(n));
    std::vector<std::span<float>> out(values.begin(), values.end());
    std::vector<std::span<const float>> in(grads.begin(), grads.end());
    const auto start = std::chrono::steady_clock::now();
    const auto end = start + std::chrono::duration<double>(seconds);
    uint64_t steps = 0;
    while (std::chrono::steady_clock::now() < end) {
      client.pull(names, out);
      for (int t = 0; t < 4; ++t) {
        for (uint64_t i = 0; i < n; ++i)
          grads[t][i] = 0.01f * values[t][i] + 1e-3f * std::sin(float(i + steps));
      }
      client.push(names, in);
      ++steps;
    }
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("worker %d: %llu steps in %.1f s (%.1f steps/s, %.1f MB/s each way)\n", worker,
                static_cast<unsigned long long>(steps), took, steps / took,
                steps * 4.0 * n * 4 / took / 1e6);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak_worker %d: %s\n", worker, e.what());
    return 1;
  }
  return 0;
}
