// hello_cluster: two tensors w and b on the ps; every worker reads them and
// prints w + b, w * b and w / b (TensorFlow's "hello distributed" in
// libpsclient terms). The chief creates them, the others wait for it.
//
//   hello_cluster --job_name=ps     --task_index=0 --ps_hosts=127.0.0.1:2222
//   --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 & hello_cluster --job_name=worker --task_index=1
//   --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 & hello_cluster
//   --job_name=worker --task_index=0 --ps_hosts=127.0.0.1:2222
//   --worker_hosts=127.0.0.1:2230,127.0.0.1:2231
#include <cstdio>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/errors.h"
#include "ps/trainer_flags.h"
#include "ps/training_session.h"
#include "server/ps_task.h"

int main(int argc, char** argv) {
  CLI::App app{"hello_cluster: w and b on the ps, arithmetic on the workers"};
  ps::TrainerFlags f;
  ps::add_trainer_flags(app, f);
  ps::PsTaskFlags psf;
  ps::add_ps_task_flags(app, psf);
  PS_PARSE_FLAGS(app, argc, argv);
  try {
    ps::apply_log_level(psf);
    const ps::ClusterSpec spec = f.cluster_spec();
    if (spec.is_ps())
      return ps::run_ps_task(spec.task_index(), spec.num_ps(), spec.self_address(), psf);
    ps::Client client(f.client_options(spec));
    ps::TrainingSession session(client, {.job = f.job_config(spec, 0)});
    std::vector<float> w(2), b(2), unused_w(2), unused_b(2);
    session.add_variable({.name = "w",
                          .shape = {2},
                          .optimizer = {},
                          .init = ps::InitConfig::from_values({3.0f, 8.0f}),
                          .trainable = false},
                         w, unused_w);
    session.add_variable({.name = "b",
                          .shape = {2},
                          .optimizer = {},
                          .init = ps::InitConfig::from_values({1.5f, 2.0f}),
                          .trainable = false},
                         b, unused_b);
    session.initialize();  // chief creates w and b, the others wait
    session.pull();
    const int i = spec.worker_index();
    std::printf("worker %d: w = [%g %g], b = [%g %g]\n", i, w[0], w[1], b[0], b[1]);
    std::printf("worker %d: w + b = [%g %g]  w * b = [%g %g]  w / b = [%g %g]\n", i, w[0] + b[0],
                w[1] + b[1], w[0] * b[0], w[1] * b[1], w[0] / b[0], w[1] / b[1]);
    session.barrier("hello_cluster/end", static_cast<uint32_t>(spec.num_workers()),
                    std::chrono::seconds(60));
    session.end();
  } catch (const ps::ConfigError& e) {
    std::fprintf(stderr, "hello_cluster: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello_cluster: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
