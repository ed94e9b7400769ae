#include "ps/worker_loop.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "ps/job.h"
#include "ps/summary_writer.h"
#include "ps/tensor_spec.h"
#include "ps/training_session.h"

namespace ps {

WorkerHooks::WorkerHooks(const std::string& logdir, int log_every, int worker, int summary_every) {
  if (!logdir.empty()) summaries = std::make_unique<SummaryWriter>(logdir);
  log = &hooks.add<LoggingHook>(LoggingHook::Options{.every_n = log_every, .worker = worker});
  if (summaries) hooks.add<SummaryHook>(*summaries, summary_every);
}

WorkerHooks::~WorkerHooks() = default;

StepInfo WorkerHooks::start(Client& client, int log_every, int64_t train_steps, int batch_size,
                            int64_t examples_per_global_step) {
  hooks.add<ReportHook>(client, log_every > 0 ? log_every : 100);
  hooks.begin();
  StepInfo info;
  info.train_steps = train_steps;
  info.batch_size = batch_size;
  info.examples_per_global_step = examples_per_global_step;
  return info;
}

void WorkerHooks::after_step(const StepInfo& info, StepTimes& times) {
  const auto t0 = StepTimes::Clock::now();
  hooks.after_step(info);
  times.other += StepTimes::seconds(t0, StepTimes::Clock::now());
}

void StepTimes::add_step(Clock::time_point t0, Clock::time_point t1, Clock::time_point t2,
                         Clock::time_point t3, Clock::time_point t4) {
  other += seconds(t0, t1);
  pull += seconds(t1, t2);
  compute += seconds(t2, t3);
  push += seconds(t3, t4);
}

double StepTimes::total() const { return std::max(1e-12, pull + compute + push + other); }

double StepTimes::process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double StepTimes::per_step_ms(double phase, int64_t local_steps) {
  return 1e3 * phase / std::max<double>(1, static_cast<double>(local_steps));
}

void fill_step_info(StepInfo& info, const TrainingSession& session, const StepOutcome& out,
                    const OptimizerConfig& oc) {
  info.local_step = session.steps_run();
  info.global_step = out.global_step;
  info.stale = out.stale;
  info.stale_steps = session.stale_steps();
  info.learning_rate = oc.learning_rate_at(out.global_step);
}

std::string done_line_start(int worker, const TrainingSession& session, double seconds,
                            int batch_size, const char* unit) {
  const auto local = static_cast<double>(session.steps_run());
  return fmt::format(
      "worker {}: done after {} local steps in {} ({} {}/s on this worker, {} "
      "stale); per step: ",
      worker, session.steps_run(), format_duration(seconds),
      format_rate(local * batch_size / seconds), unit, session.stale_steps());
}

void print_model_ready(int worker, const JobConfig& job) {
  std::printf("worker %d: model ready, training (%s)\n", worker, to_string(job).c_str());
}

void end_barrier(TrainingSession& session, const std::string& name, int num_workers, int worker) {
  try {
    const uint32_t came = session.barrier(name, static_cast<uint32_t>(num_workers),
                                          std::chrono::seconds(60), LostWorkers::kSkip);
    if (came < static_cast<uint32_t>(num_workers)) {
      spdlog::warn("worker {}: end barrier: {} of {} workers came; psd had lost the others", worker,
                   came, num_workers);
    }
  } catch (const Error& e) {
    spdlog::warn("worker {}: end barrier: {} (going on)", worker, e.what());
  }
}

}  // namespace ps
