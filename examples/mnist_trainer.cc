// mnist_trainer: between-graph replicated training of an MLP on MNIST or
// Fashion-MNIST, as TensorFlow's distributed MNIST example (mnist_replica.py):
// the same program runs every role.
//
//   mnist_trainer --job_name=ps     --task_index=0 --ps_hosts=127.0.0.1:2222 --worker_hosts=...
//   mnist_trainer --job_name=worker --task_index=0 --ps_hosts=127.0.0.1:2222
//                 --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 [--sync_replicas] --epochs=5
//   mnist_trainer --job_name=evaluator --checkpoint_dir=/tmp/ckpt --logdir=/tmp/tb
//                 # evaluates each new checkpoint of the ps (or, with --ps_hosts, pulls from it)
//   mnist_trainer --local --epochs=5       # one process, no ps: the same loop, for comparison
//
// Without --ps_hosts/--worker_hosts the cluster comes from TF_CONFIG or Slurm.
// scripts/launch_local.sh starts a whole job on this machine.
// One file, like the other example trainers: the whole program in one place.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <kj/exception.h>
#include <spdlog/spdlog.h>

#include "server/optimizer.h"  // psd's update rules, for --local with a non-SGD optimizer
#include "ps/flag_parsing.h"
#include "ps/client.h"
#include "ps/errors.h"
#include "ps/evaluator.h"
#include "ps/hooks.h"
#include "ps/mlp.h"
#include "ps/mnist.h"
#include "ps/summary_writer.h"
#include "ps/trainer_flags.h"
#include "ps/trainer_main.h"
#include "ps/training_session.h"
#include "ps/worker_loop.h"
#include "server/ps_task.h"

namespace {

using Clock = std::chrono::steady_clock;

struct MnistFlags {
  std::string hidden_units = "100";
  std::string activation = "relu";
  int validation_size = 5000;
  int eval_every = 0;  // chief: evaluate every N local steps (0: about twice per epoch)
  int summary_every = 50;
  double target_accuracy = 0.85;
  bool stop_at_target = false;
  bool local = false;
  bool scale_lr = true;            // sync: learning rate x sqrt(replicas aggregated)
  std::string restore_from;        // chief: start the job from this checkpoint directory
  double eval_secs = 10;           // evaluator: how often it looks for new parameters
  double eval_timeout_secs = 300;  // evaluator: stops after this long with nothing new
};

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

ps::MlpShape make_shape(const MnistFlags& m, const ps::MnistData& data) {
  ps::MlpShape shape;
  shape.inputs = data.rows * data.cols;
  shape.hidden = ps::parse_positive_ints("--hidden_units", m.hidden_units, "100 or 512,512");
  shape.classes = ps::MnistData::kNumClasses;
  shape.activation = ps::parse_activation(m.activation);
  shape.validate();
  return shape;
}

ps::Towers make_towers(const ps::MlpShape& shape, const ps::TrainerFlags& f, int local_gpu) {
  ps::EngineOptions eo;
  eo.prefer_gpu = f.num_gpus > 0;
  eo.device = local_gpu >= 0 ? local_gpu : 0;
  eo.max_batch = f.batch_size;
  if (f.num_gpus > 0 && ps::cuda_device_count() < eo.device + f.num_gpus) {
    throw ps::ConfigError(
        fmt::format("--num_gpus={} but only {} CUDA device(s) usable from device {}", f.num_gpus,
                    ps::cuda_device_count(), eo.device));
  }
  return ps::Towers::make(shape, eo, std::max(1, f.num_gpus));
}

struct Evaluation {
  ps::EvalStats test, validation;
};

Evaluation evaluate(ps::Towers& towers, const ps::MnistData& data) {
  Evaluation e;
  e.test = towers.evaluate({data.test.images.data(), data.test.images.size()},
                           {data.test.labels.data(), data.test.labels.size()});
  if (data.validation.size > 0) {
    e.validation = towers.evaluate({data.validation.images.data(), data.validation.images.size()},
                                   {data.validation.labels.data(), data.validation.labels.size()});
  }
  return e;
}

// "n/a" with --validation_size 0 (an accuracy of 0 would look like a result).
std::string validation_accuracy(const Evaluation& e, const ps::MnistData& data) {
  return data.validation.size > 0 ? fmt::format("{:.4f}", e.validation.accuracy()) : "n/a";
}

// The chief's periodic evaluation: a line, summaries, the first time the
// test accuracy reaches the target.
struct Evaluator {
  ps::Towers& towers;
  const ps::MnistData& data;
  ps::SummaryWriter* summaries;
  ps::LoggingHook* log;
  double target;
  Clock::time_point start;
  std::optional<double> time_to_target{};
  std::optional<int64_t> step_at_target{};
  // The last step evaluated: the final evaluation often falls on the step
  // of a periodic one, whose line and summaries are not written twice.
  std::optional<std::pair<int64_t, Evaluation>> last{};

  Evaluation run(int64_t global_step, double epoch) {
    if (last && last->first == global_step) return last->second;
    Evaluation e = evaluate(towers, data);
    last.emplace(global_step, e);
    const double t = seconds(start, Clock::now());
    if (!time_to_target && target > 0 && e.test.accuracy() >= target) {
      time_to_target = t;
      step_at_target = global_step;
    }
    if (log) log->clear_bar();
    std::printf(
        "eval  | epoch %.2f | global step %lld | validation accuracy %s | test accuracy %.4f | "
        "test "
        "cross-entropy %.4f | %.1f s\n",
        epoch, static_cast<long long>(global_step), validation_accuracy(e, data).c_str(),
        e.test.accuracy(), e.test.loss, t);
    std::fflush(stdout);
    if (summaries) {
      summaries->add_scalar("accuracy/test", static_cast<float>(e.test.accuracy()), global_step);
      summaries->add_scalar("cross_entropy/test", static_cast<float>(e.test.loss), global_step);
      if (data.validation.size > 0) {
        summaries->add_scalar("accuracy/validation", static_cast<float>(e.validation.accuracy()),
                              global_step);
        summaries->add_scalar("cross_entropy/validation", static_cast<float>(e.validation.loss),
                              global_step);
      }
      summaries->flush();
    }
    return e;
  }
};

void print_result(const char* mode, const Evaluation& e, int64_t global_steps, double epochs,
                  double secs, double samples, const Evaluator& ev) {
  std::printf("\n== %s: test accuracy %.4f, test cross-entropy %.4f, validation accuracy %s\n",
              mode, e.test.accuracy(), e.test.loss, validation_accuracy(e, ev.data).c_str());
  std::printf("== %lld global steps, %.2f epochs in %s: %s samples/s",
              static_cast<long long>(global_steps), epochs, ps::format_duration(secs).c_str(),
              ps::format_rate(samples / secs).c_str());
  if (ev.time_to_target) {
    std::printf(", test accuracy %.2f reached after %.1f s (global step %lld)", ev.target,
                *ev.time_to_target, static_cast<long long>(*ev.step_at_target));
  }
  std::printf("\n");
  // One machine-readable line (bench/train_throughput.sh reads it).
  std::printf(
      "RESULT mode=%s test_accuracy=%.4f test_xent=%.4f seconds=%.3f samples_per_sec=%.0f "
      "time_to_target=%.3f\n",
      mode, e.test.accuracy(), e.test.loss, secs, samples / secs,
      ev.time_to_target ? *ev.time_to_target : -1.0);
  std::fflush(stdout);
}

// Loading and decompressing the data takes seconds: said before and after.
ps::MnistData load_data(const ps::TrainerFlags& f, const MnistFlags& m, const std::string& who) {
  spdlog::info("{}: loading data from {} ...", who, f.data_dir);
  const auto start = Clock::now();
  ps::MnistData data = ps::MnistData::load(f.data_dir, m.validation_size);
  spdlog::info("{}: {} training, {} validation, {} test examples loaded in {}", who,
               data.train.size, data.validation.size, data.test.size,
               ps::format_duration(seconds(start, Clock::now())));
  return data;
}

int eval_interval(const MnistFlags& m, int64_t train_examples, int64_t examples_per_local_step) {
  if (m.eval_every > 0) return m.eval_every;
  return static_cast<int>(std::max<int64_t>(1, train_examples / examples_per_local_step / 2));
}

// --local: the same step loop in one process, no cluster and no psd.
int run_local(const ps::TrainerFlags& f, const MnistFlags& m) {
  auto data = load_data(f, m, "local");
  const ps::MlpShape shape = make_shape(m, data);
  ps::Towers towers = make_towers(shape, f, -1);
  ps::init_params(shape, towers.host_params(), f.seed);
  towers.upload_params();
  ps::DataShard shard(data.train, 0, 1, f.seed);
  const int64_t steps = f.train_steps > 0
                            ? f.train_steps
                            : ps::steps_for_epochs(f.epochs, data.train.size, f.batch_size);
  if (steps <= 0) throw ps::ConfigError("give --train_steps or --epochs (both are 0)");
  const ps::OptimizerConfig oc =
      f.optimizer_config(std::max<int64_t>(1, data.train.size / f.batch_size), steps);
  // SGD runs in the engine (apply_sgd); other rules as psd applies them.
  std::unique_ptr<ps::Optimizer> opt;
  std::vector<std::vector<float>> slots;
  if (oc.kind != ps::OptimizerKind::kSgd) {
    opt = ps::make_optimizer(oc);
    slots = opt->make_slots(towers.host_params().size());
  }
  std::unique_ptr<ps::SummaryWriter> summaries;
  if (!f.logdir.empty()) summaries = std::make_unique<ps::SummaryWriter>(f.logdir);

  std::printf(
      "local training: %s, %s, batch %d, %lld steps (%.2f epochs of %lld examples), %s\n",
      shape.to_string().c_str(), f.optimizer.c_str(), f.batch_size, static_cast<long long>(steps),
      static_cast<double>(steps) * f.batch_size / data.train.size,
      static_cast<long long>(data.train.size), towers.engine(0).device_description().c_str());
  ps::HookList hooks;
  auto& log =
      hooks.add<ps::LoggingHook>(ps::LoggingHook::Options{.every_n = f.log_every, .worker = 0});
  if (summaries) hooks.add<ps::SummaryHook>(*summaries, m.summary_every);
  const auto start = Clock::now();
  Evaluator ev{.towers = towers,
               .data = data,
               .summaries = summaries.get(),
               .log = &log,
               .target = m.target_accuracy,
               .start = start};
  const int every = eval_interval(m, data.train.size, f.batch_size);
  hooks.add<ps::EveryNStepsHook>(every,
                                 [&](const ps::StepInfo& s) { ev.run(s.global_step, s.epoch); });
  ps::StepInfo info;
  info.train_steps = steps;
  info.batch_size = info.examples_per_global_step = f.batch_size;
  hooks.begin();
  for (int64_t step = 0; step < steps; ++step) {
    ps::Batch b = shard.next_batch(f.batch_size);
    ps::StepStats st = towers.compute_gradients({b.images, static_cast<size_t>(b.size) * b.dim},
                                                {b.labels, static_cast<size_t>(b.size)});
    const float lr = oc.learning_rate_at(step);
    if (opt) {
      opt->apply(towers.host_params(), towers.host_grads(), slots, step, 1.0f);
      towers.upload_params();
    } else {
      towers.apply_sgd(lr);
    }
    info.local_step = info.global_step = step + 1;
    info.epoch = static_cast<double>(step + 1) * f.batch_size / data.train.size;
    info.loss = st.loss;
    info.accuracy = st.accuracy();
    info.learning_rate = lr;
    hooks.after_step(info);
    if (m.stop_at_target && ev.time_to_target) break;
  }
  const double secs = seconds(start, Clock::now());
  hooks.end(info);
  Evaluation e = ev.run(info.global_step, info.epoch);
  print_result("local", e, info.global_step, info.epoch, secs,
               static_cast<double>(info.global_step) * f.batch_size, ev);
  return 0;
}

// --job_name=evaluator: evaluates the job's parameters as they change, from
// the ps tasks' checkpoints (checkpoint_dir) or pulled from `ps_hosts`, in a
// process of its own at a lower CPU priority, and writes the scalars the chief
// writes to <logdir>/eval (TensorBoard shows them as a run beside the chief's).
int run_evaluator_task(const ps::TrainerFlags& f, const MnistFlags& m,
                       const std::string& checkpoint_dir,
                       const std::vector<std::string>& ps_hosts) {
  // Nice 10: on a machine shared with workers, they get the CPU first.
  if (::setpriority(PRIO_PROCESS, 0, 10) != 0)
    spdlog::warn("evaluator: could not lower its CPU priority (going on)");
  if (checkpoint_dir.empty() && ps_hosts.empty()) {
    throw ps::ConfigError(
        "--job_name=evaluator reads the model from --checkpoint_dir (the ps tasks' checkpoints) "
        "or pulls it from --ps_hosts: give one");
  }
  if (!(m.eval_secs > 0) || !(m.eval_timeout_secs > 0))
    throw ps::ConfigError("--eval_secs and --eval_timeout_secs must be > 0");
  auto data = load_data(f, m, "evaluator");
  const ps::MlpShape shape = make_shape(m, data);
  ps::Towers towers = make_towers(shape, f, -1);
  std::unique_ptr<ps::SummaryWriter> summaries;
  if (!f.logdir.empty()) summaries = std::make_unique<ps::SummaryWriter>(f.logdir + "/eval");
  std::unique_ptr<ps::Client> client;
  ps::EvaluatorOptions eo;
  eo.checkpoint_dir = checkpoint_dir;
  eo.interval = std::chrono::milliseconds(static_cast<int64_t>(m.eval_secs * 1000));
  eo.timeout = std::chrono::milliseconds(static_cast<int64_t>(m.eval_timeout_secs * 1000));
  for (const ps::TensorSlot& t : towers.layout().tensors()) eo.tensors.push_back(t.name);
  if (checkpoint_dir.empty()) {
    ps::ClientOptions co;  // a tool (worker_index -1): no worker of the job
    co.ps_hosts = ps_hosts;
    co.connect_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(f.connect_timeout_s * 1000));
    co.call_timeout = std::max(co.call_timeout, co.connect_timeout);
    co.dead_peer_timeout = std::chrono::seconds(f.dead_peer_secs);
    co.auth_token_file = f.auth_token_file;
    co.reconnect_timeout = std::chrono::seconds(2);  // psd exits when the job is done
    client = std::make_unique<ps::Client>(co);
    eo.client = client.get();
  }
  std::span<float> params = towers.host_params();
  const auto start = Clock::now();
  const ps::EvaluatorResult r = ps::run_evaluator(eo, [&](const ps::ParameterSnapshot& s) {
    for (const ps::TensorSlot& t : towers.layout().tensors()) {
      auto it = s.tensors.find(t.name);
      if (it == s.tensors.end()) {
        throw ps::ConfigError(
            fmt::format("the job's model has no tensor '{}': is --hidden_units ({}) the chief's?",
                        t.name, m.hidden_units));
      }
      if (it->second.size() != t.count) {
        throw ps::ConfigError(fmt::format(
            "tensor '{}' has {} values in the job, {} in this model: is --hidden_units ({}) the "
            "chief's?",
            t.name, it->second.size(), t.count, m.hidden_units));
      }
      std::copy(it->second.begin(), it->second.end(), params.begin() + t.offset);
    }
    towers.upload_params();
    const Evaluation e = evaluate(towers, data);
    std::printf(
        "evaluator | global step %lld | validation accuracy %s | test accuracy %.4f | test "
        "cross-entropy %.4f | %.1f s%s\n",
        static_cast<long long>(s.global_step), validation_accuracy(e, data).c_str(),
        e.test.accuracy(), e.test.loss, seconds(start, Clock::now()), s.final ? " | final" : "");
    std::fflush(stdout);
    if (summaries) {
      summaries->add_scalar("accuracy/test", static_cast<float>(e.test.accuracy()), s.global_step);
      summaries->add_scalar("cross_entropy/test", static_cast<float>(e.test.loss), s.global_step);
      if (data.validation.size > 0) {
        summaries->add_scalar("accuracy/validation", static_cast<float>(e.validation.accuracy()),
                              s.global_step);
        summaries->add_scalar("cross_entropy/validation", static_cast<float>(e.validation.loss),
                              s.global_step);
      }
      summaries->flush();
    }
  });
  const std::string last =
      r.evaluations > 0 ? " (last at global step " + std::to_string(r.last_step) + ")" : "";
  std::printf("evaluator: done after %lld evaluations%s: %s\n",
              static_cast<long long>(r.evaluations), last.c_str(), r.stopped_because.c_str());
  std::fflush(stdout);
  return r.evaluations > 0 ? 0 : 1;
}

int run_worker(const ps::ClusterSpec& spec, ps::TrainerFlags f, const MnistFlags& m) {
  // Sync steps average R gradients: a batch R times larger, which takes a
  // larger step (the square-root rule, suited to Adam).
  if (f.sync_replicas && m.scale_lr)
    f.learning_rate *= static_cast<float>(std::sqrt(f.replicas(spec)));
  // Data first: a bad file fails before anything connects.
  auto data = load_data(f, m, "worker " + std::to_string(spec.worker_index()));
  const ps::MlpShape shape = make_shape(m, data);
  ps::Towers towers = make_towers(shape, f, spec.local_gpu());
  ps::DataShard shard(data.train, spec.worker_index(), spec.num_workers(), f.seed);
  int64_t steps = f.global_steps(spec, data.train.size);
  int64_t per_global = f.examples_per_global_step(spec);
  const ps::JobConfig job = f.job_config(spec, steps);
  const ps::OptimizerConfig oc =
      f.optimizer_config(std::max<int64_t>(1, data.train.size / per_global), steps);
  const bool chief = spec.is_chief();
  const int worker = spec.worker_index();

  spdlog::info("{}: {}", spec.to_string(), to_string(job));
  ps::Client client(f.client_options(spec));
  ps::TrainingSession session(client,
                              {.job = job, .restore_from = chief ? m.restore_from : std::string()});
  // Every variable pulls straight into the engine's flat parameter buffer and
  // pushes straight from its gradient buffer: no copies on the worker.
  session.add_variables(towers.layout().tensors(), towers.host_params(), towers.host_grads(), oc,
                        f.seed);
  session.initialize();
  // The chief's job decides: a worker started with other mode flags trains
  // in the job's mode, and counts its progress and epochs by it too.
  if (session.job().train_steps > 0) steps = session.job().train_steps;
  // A job restored from a checkpoint goes on from its step (the session
  // read it before the other workers could start): one already at its stop
  // step has nothing left to train.
  const int64_t start_global = session.start_step();
  if (session.should_stop()) {
    std::printf(
        "worker %d: the job already finished at global step %lld (its stop step): nothing to "
        "train. To go "
        "on, run it again with more --train_steps or --epochs.\n",
        worker, static_cast<long long>(start_global));
    std::fflush(stdout);
    // A worker started after the others trained the job through is the one
    // their end barrier waits for: every worker arrives there too, the chief
    // included, unless the chief has ended the job already.
    if (!client.stats().front().finished)
      ps::end_barrier(session, "mnist_trainer/end", spec.num_workers(), worker);
    if (chief) session.end();  // the ps tasks exit once every worker has disconnected
    return 0;
  }
  per_global = session.examples_per_global_step(f.batch_size);
  if (chief) {
    std::printf(
        "worker %d (chief): %s, %s lr %g, batch %d, %s, %lld global steps (%.2f epochs of %lld "
        "examples), "
        "%d workers, %d ps%s\n",
        worker, shape.to_string().c_str(), f.optimizer.c_str(), f.learning_rate, f.batch_size,
        to_string(session.job()).c_str(), static_cast<long long>(steps),
        static_cast<double>(steps) * per_global / data.train.size,
        static_cast<long long>(data.train.size), spec.num_workers(), spec.num_ps(),
        start_global > 0 ? fmt::format("; going on from global step {}", start_global).c_str()
                         : "");
    // psd keeps each tensor's optimizer as the job created it: a job going on
    // from psd's own checkpoint keeps its first run's schedule. --restore_from
    // creates the tensors anew, with this run's.
    if (start_global > 0 && m.restore_from.empty() && f.lr_schedule == "cosine") {
      std::printf(
          "worker %d (chief): the learning rate keeps the schedule the job was created with (psd "
          "keeps it with the model): a cosine one ends at the first run's planned steps and "
          "stays at its --lr_alpha x the rate from there\n",
          worker);
    }
  } else {
    ps::print_model_ready(worker, session.job());
  }
  std::fflush(stdout);

  ps::WorkerHooks wh(chief ? f.logdir : std::string(), f.log_every, worker, m.summary_every);
  ps::HookList& hooks = wh.hooks;
  const std::unique_ptr<ps::SummaryWriter>& summaries = wh.summaries;
  const auto start = Clock::now();
  Evaluator ev{.towers = towers,
               .data = data,
               .summaries = summaries.get(),
               .log = wh.log,
               .target = m.target_accuracy,
               .start = start};
  int64_t pulled_step = 0;
  if (chief) {
    const int every =
        eval_interval(m, data.train.size, static_cast<int64_t>(f.batch_size) * spec.num_workers());
    // The parameters evaluated are those pulled for the step, not yet
    // updated by it: labelled with the step they were pulled at.
    hooks.add<ps::EveryNStepsHook>(every, [&](const ps::StepInfo&) {
      ev.run(pulled_step, static_cast<double>(pulled_step) * per_global / data.train.size);
    });
  }
  // psd's status page and /metrics show each worker's loss and speed.
  ps::StepInfo info = wh.start(client, f.log_every, steps, f.batch_size, per_global);
  // Where a worker's time goes: waiting for the pull (network + the ps +, in
  // sync mode, the other workers), computing, pushing.
  ps::StepTimes times;
  while (!session.should_stop() && !hooks.stop_requested()) {
    const auto t0 = Clock::now();
    ps::Batch b = shard.next_batch(f.batch_size);
    const auto t1 = Clock::now();
    pulled_step = session.pull();
    const auto t2 = Clock::now();
    if (session.should_stop()) break;  // the job ended while this worker waited for its step
    towers.upload_params();
    ps::StepStats st = towers.compute_gradients({b.images, static_cast<size_t>(b.size) * b.dim},
                                                {b.labels, static_cast<size_t>(b.size)});
    const auto t3 = Clock::now();
    ps::StepOutcome out = session.push();
    const auto t4 = Clock::now();
    times.add_step(t0, t1, t2, t3, t4);
    ps::fill_step_info(info, session, out, oc);
    info.epoch = static_cast<double>(out.global_step) * per_global / data.train.size;
    info.loss = st.loss;
    info.accuracy = st.accuracy();
    wh.after_step(info, times);
  }
  const double secs = seconds(start, Clock::now());
  hooks.end(info);
  const int64_t local = session.steps_run();
  std::printf("%spull %.3f ms, compute %.3f ms, push %.3f ms, data+hooks %.3f ms; CPU %.3f ms\n",
              ps::done_line_start(worker, session, secs, f.batch_size, "samples").c_str(),
              ps::StepTimes::per_step_ms(times.pull, local),
              ps::StepTimes::per_step_ms(times.compute, local),
              ps::StepTimes::per_step_ms(times.push, local),
              ps::StepTimes::per_step_ms(times.other, local), times.cpu_per_step_ms(local));
  std::fflush(stdout);

  // Everyone meets once more so the chief reads the final parameters.
  ps::end_barrier(session, "mnist_trainer/end", spec.num_workers(), worker);
  if (chief) {
    ps::PullResult final_pull = session.pull_latest();
    towers.upload_params();
    const int64_t global = std::max(final_pull.step, info.global_step);
    Evaluation e = ev.run(global, static_cast<double>(global) * per_global / data.train.size);
    // The rate counts the steps trained here, not those a restored job brought.
    print_result(ps::sync_mode_name(job.mode), e, global,
                 static_cast<double>(global) * per_global / data.train.size, secs,
                 static_cast<double>(global - start_global) * per_global, ev);
    if (summaries) summaries->flush();
    session.end();  // the ps tasks exit once every worker has disconnected
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mnist_trainer: distributed MLP training on (Fashion-)MNIST with psd"};
  ps::TrainerFlags f;
  f.epochs = 5;
  f.learning_rate = 0.002f;
  // Cosine over the planned steps: more epochs keep paying (docs/training.md,
  // "The default schedule", has the measurement).
  f.lr_schedule = "cosine";
  f.lr_alpha = 0.1;  // an extended job (a larger --train_steps) goes on at 0.1 x the rate
  ps::add_trainer_flags(app, f);
  MnistFlags m;
  app.add_option("--hidden_units", m.hidden_units,
                 "hidden layer sizes: one (100) or a list (512,512)")
      ->capture_default_str();
  app.add_option("--activation", m.activation, "relu or sigmoid")->capture_default_str();
  app.add_option("--validation_size", m.validation_size,
                 "training examples held out for validation")
      ->capture_default_str();
  app.add_option("--eval_every", m.eval_every,
                 "chief: evaluate every N local steps (0: twice per epoch)")
      ->capture_default_str();
  app.add_option("--summary_every", m.summary_every,
                 "chief: TensorBoard scalars every N local steps")
      ->capture_default_str();
  app.add_option("--target_accuracy", m.target_accuracy,
                 "report when the test accuracy first reaches this")
      ->capture_default_str();
  app.add_flag("--stop_at_target", m.stop_at_target,
               "--local: stop once the target accuracy is reached");
  app.add_option("--scale_lr", m.scale_lr,
                 "sync: multiply the learning rate by sqrt(replicas_to_aggregate)")
      ->capture_default_str();
  app.add_option("--restore_from", m.restore_from,
                 "chief: start the job from the newest checkpoint in this directory (a ps "
                 "--checkpoint_dir) and go "
                 "on from its step");
  app.add_option("--eval_secs", m.eval_secs,
                 "evaluator: look for new parameters (a checkpoint, or psd's step) this often")
      ->capture_default_str();
  app.add_option("--eval_timeout_secs", m.eval_timeout_secs,
                 "evaluator: stop after this long without new parameters")
      ->capture_default_str();
  app.add_flag("--local", m.local,
               "train in this process alone: no cluster, no psd (for comparison)");
  ps::PsTaskFlags psf;
  ps::add_ps_task_flags(app, psf);
  PS_PARSE_FLAGS(app, argc, argv);
  return ps::run_trainer_roles(
      "mnist_trainer", f,
      {.prepare = [&] { ps::apply_log_level(psf); },
       .check =
           [&] {
             if (m.validation_size < 0) throw ps::ConfigError("--validation_size must be >= 0");
           },
       .local = m.local ? std::function<int()>([&] { return run_local(f, m); }) : nullptr,
       .ps =
           [&](int task, int num_ps, const std::string& address) {
             return ps::run_ps_task(task, num_ps, address, psf);
           },
       .worker = [&](const ps::ClusterSpec& spec) { return run_worker(spec, f, m); },
       .evaluator =
           [&](const std::vector<std::string>& ps_hosts) {
             return run_evaluator_task(f, m, psf.options.checkpoint.dir, ps_hosts);
           }});
}
