// A training worker process for the failure tests: a sync job (worker 0 is
// the chief) on a 256-float SGD tensor with a constant gradient, one step
// every --sleep_ms, until the job's train_steps. Killed and restarted by
// the tests; exits 0 when the job is done.
#include <chrono>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>

#include "ps/client.h"
#include "ps/training_session.h"

int main(int argc, char** argv) {
  CLI::App app{"sync_worker"};
  std::string hosts;
  int worker = 0, workers = 3, replicas = 3, steps = 50, sleep_ms = 20, dead_peer_secs = 30;
  app.add_option("--ps_hosts", hosts)->required();
  app.add_option("--worker", worker);
  app.add_option("--workers", workers);
  app.add_option("--replicas", replicas);
  app.add_option("--steps", steps);
  app.add_option("--sleep_ms", sleep_ms);
  app.add_option("--dead_peer_secs", dead_peer_secs);
  CLI11_PARSE(app, argc, argv);
  try {
    ps::ClientOptions o;
    o.ps_hosts = {hosts};
    o.worker_index = worker;
    o.is_chief = worker == 0;
    o.reconnect_timeout = std::chrono::milliseconds(10000);
    o.dead_peer_timeout = std::chrono::seconds(dead_peer_secs);
    ps::Client client(o);
    ps::TrainingSession session(client, {.job = {.mode = ps::SyncMode::kSync,
                                                 .replicas_to_aggregate = uint32_t(replicas),
                                                 .total_replicas = uint32_t(workers),
                                                 .train_steps = steps}});
    std::vector<float> v(256), g(256, 1.0f);
    session.add_variable(
        {.name = "v", .shape = {256}, .optimizer = ps::OptimizerConfig::sgd(0.001f)}, v, g);
    session.initialize();
    while (!session.should_stop()) {
      session.run_step([&] { std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms)); });
    }
    std::printf("worker %d done at global step %lld\n", worker,
                static_cast<long long>(session.global_step()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker %d: %s\n", worker, e.what());
    return 1;
  }
  return 0;
}
