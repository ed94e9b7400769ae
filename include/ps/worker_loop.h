// The parts of a distributed trainer's worker loop that do not depend on its
// model: the hooks every worker runs (WorkerHooks), where a step's time goes
// (StepTimes), the StepInfo fields a TrainingSession step gives
// (fill_step_info), the line a non-chief worker prints once the model is
// ready, and the end barrier before the chief evaluates the final model.
//
// Example:
//   ps::WorkerHooks wh(spec.is_chief() ? flags.logdir : "", flags.log_every,
//                      spec.worker_index(), /*summary_every=*/100);
//   wh.hooks.add<ps::EveryNStepsHook>(1000, [&](const ps::StepInfo&) { evaluate(); });
//   ps::StepInfo info = wh.start(client, flags.log_every, steps, flags.batch_size,
//                                flags.examples_per_global_step(spec));
//   ps::StepTimes times;
//   while (!session.should_stop() && !wh.hooks.stop_requested()) {
//     const auto t0 = ps::StepTimes::Clock::now();   // next batch
//     const auto t1 = ps::StepTimes::Clock::now();   session.pull();
//     const auto t2 = ps::StepTimes::Clock::now();   // compute the gradients
//     const auto t3 = ps::StepTimes::Clock::now();   ps::StepOutcome out = session.push();
//     const auto t4 = ps::StepTimes::Clock::now();
//     times.add_step(t0, t1, t2, t3, t4);
//     ps::fill_step_info(info, session, out, optimizer_config);
//     wh.after_step(info, times);
//   }
//   wh.hooks.end(info);
//   const std::string head = ps::done_line_start(worker, session, secs, batch, "examples");
//   std::printf("%spull %.3f ms\n", head.c_str(),
//               times.per_step_ms(times.pull, session.steps_run()));
//   ps::end_barrier(session, "my_trainer/end", spec.num_workers(), spec.worker_index());
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ps/hooks.h"

namespace ps {

class Client;
class TrainingSession;
struct OptimizerConfig;
struct StepOutcome;
struct StepTimes;
struct JobConfig;

// A worker's hooks: a LoggingHook (a line every `log_every` local steps) and,
// with a non-empty `logdir`, a SummaryWriter there and a SummaryHook every
// `summary_every` steps. A trainer adds its own hooks after these, then
// calls start().
class WorkerHooks {
 public:
  WorkerHooks(const std::string& logdir, int log_every, int worker, int summary_every);
  ~WorkerHooks();  // in worker_loop.cc, where SummaryWriter is complete
  WorkerHooks(const WorkerHooks&) = delete;
  WorkerHooks& operator=(const WorkerHooks&) = delete;

  // Adds a ReportHook every `log_every` local steps (100 when 0: the worker's
  // loss and speed on psd's status page and /metrics), calls every hook's
  // begin() and returns the StepInfo the loop fills in.
  StepInfo start(Client& client, int log_every, int64_t train_steps, int batch_size,
                 int64_t examples_per_global_step);
  // hooks.after_step(info), its time counted in `times.other`.
  void after_step(const StepInfo& info, StepTimes& times);

  std::unique_ptr<SummaryWriter> summaries;  // null without a logdir
  HookList hooks;
  LoggingHook* log;  // owned by `hooks`
};

// Seconds a worker's steps spent in each phase, summed over its steps.
struct StepTimes {
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  // One step: data (t0..t1, counted in `other`), pull (t1..t2), compute
  // (t2..t3) and push (t3..t4).
  void add_step(Clock::time_point t0, Clock::time_point t1, Clock::time_point t2,
                Clock::time_point t3, Clock::time_point t4);
  // All phases together (never 0, so a share can divide by it).
  double total() const;
  // Milliseconds a step of `phase` seconds over `local_steps` steps (at least 1).
  static double per_step_ms(double phase, int64_t local_steps);
  // CPU seconds this process (all its threads) has used so far.
  static double process_cpu_seconds();
  // Milliseconds of this process's CPU per step since these times were made:
  // what a step costs where workers share cores (waits on the network cost none).
  double cpu_per_step_ms(int64_t local_steps) const {
    return per_step_ms(process_cpu_seconds() - cpu_at_start, local_steps);
  }

  double pull = 0, compute = 0, push = 0, other = 0;  // other: data and hooks
  double cpu_at_start = process_cpu_seconds();
};

// Sets the fields of `info` a step of `session` decides: local and global
// step, staleness and the learning rate `oc` gives at the global step.
void fill_step_info(StepInfo& info, const TrainingSession& session, const StepOutcome& out,
                    const OptimizerConfig& oc);

// "worker W: done after N local steps in T (R <unit>/s on this worker, S
// stale); per step: ", the start of a worker's last line; the trainer adds
// its per-phase times.
std::string done_line_start(int worker, const TrainingSession& session, double seconds,
                            int batch_size, const char* unit);

// "worker N: model ready, training (<job>)" on stdout: a non-chief worker's
// line once the chief has initialised the model.
void print_model_ready(int worker, const JobConfig& job);

// Every worker meets at `name` (TrainingSession::barrier, a minute at most)
// so that the chief then sees the final model. Workers psd has lost (a dead
// worker) are not waited for (LostWorkers::kSkip); a barrier that fails, or
// ends without them, is logged as a warning and the worker goes on.
void end_barrier(TrainingSession& session, const std::string& name, int num_workers, int worker);

}  // namespace ps
