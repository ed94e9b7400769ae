// linreg_trainer: fits y = 2x + 10 (plus noise) with a weight and a bias on
// the ps, the smallest complete between-graph trainer. Same cluster flags as
// mnist_trainer (and TF_CONFIG / Slurm); prints the fitted weight and bias.
//
//   linreg_trainer --job_name=ps     --task_index=0 --ps_hosts=127.0.0.1:2222
//   --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 & linreg_trainer --job_name=worker --task_index=1
//   --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 & linreg_trainer
//   --job_name=worker --task_index=0 --ps_hosts=127.0.0.1:2222
//   --worker_hosts=127.0.0.1:2230,127.0.0.1:2231
#include <cmath>
#include <cstdio>
#include <random>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/errors.h"
#include "ps/hooks.h"
#include "ps/summary_writer.h"
#include "ps/trainer_flags.h"
#include "ps/training_session.h"
#include "server/ps_task.h"

namespace {

int run_worker(const ps::ClusterSpec& spec, const ps::TrainerFlags& f, int examples) {
  // This worker's data: y = 2x + 10 + N(0, 0.1), x uniform in [-1, 1].
  std::mt19937_64 rng(f.seed * 1000 + static_cast<uint64_t>(spec.worker_index()));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  std::vector<float> xs(examples), ys(examples);
  for (int i = 0; i < examples; ++i) {
    xs[i] = ux(rng);
    ys[i] = 2.0f * xs[i] + 10.0f + noise(rng);
  }

  // The flags are checked before anything connects.
  const int64_t steps = f.global_steps(spec, examples * static_cast<int64_t>(spec.num_workers()));
  const ps::JobConfig job = f.job_config(spec, steps);
  ps::Client client(f.client_options(spec));
  ps::TrainingSession session(client, {.job = job});
  std::vector<float> w(1), b(1), gw(1), gb(1);
  session.add_variable({.name = "linreg/weight",
                        .shape = {1},
                        .optimizer = f.optimizer_config(),
                        .init = ps::InitConfig::zeros(),
                        .trainable = true},
                       w, gw);
  session.add_variable({.name = "linreg/bias",
                        .shape = {1},
                        .optimizer = f.optimizer_config(),
                        .init = ps::InitConfig::zeros(),
                        .trainable = true},
                       b, gb);
  session.initialize();

  std::unique_ptr<ps::SummaryWriter> summaries;
  if (spec.is_chief() && !f.logdir.empty())
    summaries = std::make_unique<ps::SummaryWriter>(f.logdir);
  ps::HookList hooks;
  hooks.add<ps::LoggingHook>(
      ps::LoggingHook::Options{.every_n = f.log_every, .worker = spec.worker_index()});
  if (summaries) hooks.add<ps::SummaryHook>(*summaries, 10);
  hooks.begin();

  ps::StepInfo info;
  info.train_steps = steps;
  info.batch_size = f.batch_size;
  info.examples_per_global_step = f.examples_per_global_step(spec);
  int64_t pos = 0;
  while (!session.should_stop()) {
    double loss = 0;
    ps::StepOutcome out = session.run_step([&] {
      // Mean squared error over one batch, and its gradient.
      gw[0] = gb[0] = 0;
      for (int i = 0; i < f.batch_size; ++i, pos = (pos + 1) % examples) {
        const float err = w[0] * xs[pos] + b[0] - ys[pos];
        loss += err * err;
        gw[0] += 2 * err * xs[pos];
        gb[0] += 2 * err;
      }
      loss /= f.batch_size;
      gw[0] /= f.batch_size;
      gb[0] /= f.batch_size;
    });
    info.local_step = session.steps_run();
    info.global_step = out.global_step;
    info.epoch = static_cast<double>(session.local_step()) * f.batch_size / examples;
    info.loss = loss;
    info.stale_steps = session.stale_steps();
    info.learning_rate = f.learning_rate;
    hooks.after_step(info);
  }
  hooks.end(info);
  session.barrier("linreg/end", static_cast<uint32_t>(spec.num_workers()),
                  std::chrono::seconds(60));
  client.pull({"linreg/weight", "linreg/bias"}, {std::span<float>(w), std::span<float>(b)});
  std::printf("worker %d: fitted y = %.4f x + %.4f (true: y = 2 x + 10) after %lld global steps\n",
              spec.worker_index(), w[0], b[0], static_cast<long long>(session.global_step()));
  if (spec.is_chief()) {
    const bool ok = std::abs(w[0] - 2.0f) < 0.1f && std::abs(b[0] - 10.0f) < 0.1f;
    std::printf("RESULT weight=%.4f bias=%.4f %s\n", w[0], b[0],
                ok ? "converged" : "NOT converged");
    session.end();
    return ok ? 0 : 4;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"linreg_trainer: fit y = 2x + 10 on psd"};
  ps::TrainerFlags f;
  f.optimizer = "sgd";
  f.learning_rate = 0.1f;
  f.batch_size = 32;
  f.train_steps = 600;
  f.log_every = 100;
  ps::add_trainer_flags(app, f);
  int examples = 1000;
  app.add_option("--examples", examples, "examples per worker")->capture_default_str();
  ps::PsTaskFlags psf;
  ps::add_ps_task_flags(app, psf);
  PS_PARSE_FLAGS(app, argc, argv);
  return ps::run_trainer_main("linreg_trainer", [&] {
    ps::apply_log_level(psf);
    f.validate();
    if (examples < 1) throw ps::ConfigError("--examples must be >= 1");
    const ps::ClusterSpec spec = f.cluster_spec();
    if (spec.is_ps())
      return ps::run_ps_task(spec.task_index(), spec.num_ps(), spec.self_address(), psf);
    if (!spec.is_worker())
      throw ps::ConfigError("task type '" + spec.job_name() + "' is not supported");
    return run_worker(spec, f, examples);
  });
}
