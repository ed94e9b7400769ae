// A trainer of your own against the installed libpsclient: linear regression
// y = 3x - 1 with TensorFlow's flags, TF_CONFIG or Slurm, chief init, logging.
//   c++ -std=c++20 my_trainer.cc $(pkg-config --cflags --libs psclient) -o my_trainer
//   psd --port 2222 &
//   ./my_trainer --job_name=worker --task_index=0 --ps_hosts=127.0.0.1:2222
//   --worker_hosts=127.0.0.1:2223
#include <cstdio>
#include <random>

#include <ps/hooks.h>
#include <ps/trainer_flags.h>
#include <ps/training_session.h>

#include "ps/flag_parsing.h"

int main(int argc, char** argv) {
  CLI::App app{"my_trainer"};
  ps::TrainerFlags flags;
  flags.optimizer = "sgd";
  flags.learning_rate = 0.1f;
  flags.train_steps = 300;
  ps::add_trainer_flags(app, flags);
  PS_PARSE_FLAGS(app, argc, argv);
  try {
    ps::ClusterSpec spec = flags.cluster_spec();  // flags, else TF_CONFIG, else Slurm
    if (spec.is_ps()) throw ps::ConfigError("run psd for ps tasks");
    const ps::JobConfig job =
        flags.job_config(spec, flags.train_steps);  // checks the flags (ConfigError)
    ps::Client client(flags.client_options(spec));
    ps::TrainingSession session(client, {.job = job});
    std::vector<float> w(1), b(1), gw(1), gb(1);
    session.add_variable({.name = "w",
                          .shape = {1},
                          .optimizer = flags.optimizer_config(),
                          .init = ps::InitConfig::zeros(),
                          .trainable = true},
                         w, gw);
    session.add_variable({.name = "b",
                          .shape = {1},
                          .optimizer = flags.optimizer_config(),
                          .init = ps::InitConfig::zeros(),
                          .trainable = true},
                         b, gb);
    session.initialize();  // the chief creates the variables, the others wait

    ps::HookList hooks;
    hooks.add<ps::LoggingHook>(
        ps::LoggingHook::Options{.every_n = 100, .worker = spec.worker_index()});
    hooks.begin();
    std::mt19937 rng(spec.worker_index());
    std::uniform_real_distribution<float> u(-1, 1);
    ps::StepInfo info{.train_steps = flags.train_steps,
                      .batch_size = flags.batch_size,
                      .examples_per_global_step = flags.examples_per_global_step(spec)};
    while (!session.should_stop()) {
      double loss = 0;
      auto out = session.run_step([&] {
        gw[0] = gb[0] = 0;
        for (int i = 0; i < flags.batch_size; ++i) {
          const float x = u(rng), err = w[0] * x + b[0] - (3 * x - 1);
          loss += err * err / flags.batch_size;
          gw[0] += 2 * err * x / flags.batch_size;
          gb[0] += 2 * err / flags.batch_size;
        }
      });
      info.local_step = session.local_step();
      info.global_step = out.global_step;
      info.loss = loss;
      hooks.after_step(info);
    }
    hooks.end(info);
    std::printf("w = %.3f, b = %.3f (want 3, -1)\n", w[0], b[0]);
    session.end();  // chief: psd exits once the workers have left
  } catch (const ps::Error& e) {
    std::fprintf(stderr, "my_trainer: error: %s\n", e.what());
    return 1;
  }
}
