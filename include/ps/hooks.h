// Training hooks, as tf.train.SessionRunHook: small objects a trainer's step
// loop calls at the start, after every step and at the end, for logging,
// summaries, stop conditions and periodic work (evaluation, checkpoints,
// status reports).
//
// Example:
//   std::optional<ps::SummaryWriter> summaries;  // declared first: outlives the hooks
//   ps::HookList hooks;
//   hooks.add<ps::LoggingHook>(ps::LoggingHook::Options{.every_n = 100, .worker = 0});
//   if (spec.is_chief() && !flags.logdir.empty()) {
//     summaries.emplace(flags.logdir);
//     hooks.add<ps::SummaryHook>(*summaries, 100);
//   }
//   hooks.add<ps::EveryNStepsHook>(1000, [&](const ps::StepInfo& s) { evaluate(); });
//   hooks.begin();
//   while (!session.should_stop() && !hooks.stop_requested()) {
//     auto out = session.run_step(compute);
//     hooks.after_step(info);   // info: a ps::StepInfo filled from `out`
//   }
//   hooks.end(info);
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ps {

class Client;
class SummaryWriter;

// What a hook sees after a step.
struct StepInfo {
  int64_t local_step = 0;                // steps this worker completed in this run
  int64_t global_step = 0;               // the job's global step after this one
  int64_t train_steps = 0;               // the job's last global step (0: open-ended)
  double epoch = 0;                      // epochs this worker's data shard has gone through
  double loss = 0;                       // this step's batch: mean cross-entropy (or other loss)
  double accuracy = -1;                  // this step's batch (< 0: not reported)
  int64_t batch_size = 0;                // examples in this worker's step
  int64_t examples_per_global_step = 0;  // all workers together (sync: R x batch)
  uint64_t stale_steps = 0;              // this worker's gradients dropped as stale so far
  float learning_rate = 0;
  bool stale = false;  // this step's gradients were dropped
};

class TrainingHook {
 public:
  virtual ~TrainingHook() = default;
  virtual void begin() {}
  virtual void after_step(const StepInfo&) {}
  virtual void end(const StepInfo&) {}
  // The loop should end (e.g. StopAtStepHook).
  virtual bool stop_requested() const { return false; }
};

// Calls the hooks in the order they were added.
class HookList {
 public:
  template <class H, class... Args>
  H& add(Args&&... args) {
    auto h = std::make_unique<H>(std::forward<Args>(args)...);
    H& ref = *h;
    hooks_.push_back(std::move(h));
    return ref;
  }
  void add(std::unique_ptr<TrainingHook> h) { hooks_.push_back(std::move(h)); }
  void begin();
  // A call with the same (non-zero) local_step as the one before reaches no
  // hook: no step ran, e.g. run_step() found the job already done.
  void after_step(const StepInfo& s);
  void end(const StepInfo& s);
  bool stop_requested() const;

 private:
  std::vector<std::unique_ptr<TrainingHook>> hooks_;
  int64_t last_local_ = -1;
};

// A line every N local steps (worker, epoch, global and local step, loss,
// samples/s of this worker and of the job); on a terminal also a progress bar
// with ETA, redrawn at most 10 times a second. A launcher that sends the
// streams through a pipe (a log, tee) names the terminal in the environment
// variable PS_PROGRESS_TTY (e.g. /dev/pts/3): the bar is drawn there, and
// only the lines go down the pipe.
class LoggingHook : public TrainingHook {
 public:
  struct Options {
    int every_n = 100;  // 0: no lines
    int worker = 0;
    bool progress_bar = true;  // only drawn when `bar_stream` is a terminal
    std::FILE* stream = stdout;
    std::FILE* bar_stream = stderr;
  };
  explicit LoggingHook(Options o);
  ~LoggingHook() override;
  void begin() override;
  void after_step(const StepInfo& s) override;
  void end(const StepInfo& s) override;

  // Clears the bar (if drawn) so another line can be printed, e.g. an
  // evaluation result; the next step redraws it.
  void clear_bar();

 private:
  void draw_bar(const StepInfo& s, double now);
  Options o_;
  bool tty_ = false;
  std::FILE* own_tty_ = nullptr;  // opened from PS_PROGRESS_TTY; the bar's stream then
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  double last_line_t_ = 0, last_bar_t_ = -1;
  int64_t last_local_ = 0, last_global_ = 0, first_global_ = -1;
};

// Chief: TensorBoard scalars every N steps: loss, accuracy, learning_rate,
// global_step/sec, samples/sec and stale_gradients.
class SummaryHook : public TrainingHook {
 public:
  SummaryHook(SummaryWriter& writer, int every_n);
  void begin() override;
  void after_step(const StepInfo& s) override;
  void end(const StepInfo& s) override;

 private:
  SummaryWriter& writer_;
  int every_n_;
  std::chrono::steady_clock::time_point last_t_;
  int64_t last_global_ = -1;  // -1: before the first step
  double loss_sum_ = 0,
         acc_sum_ = 0;  // over the steps since the last summary (acc: those that measured it)
  int n_ = 0, acc_n_ = 0;
};

// Requests a stop once the global step (or, with `local`, this worker's
// step) reaches `last_step`.
class StopAtStepHook : public TrainingHook {
 public:
  explicit StopAtStepHook(int64_t last_step, bool local = false)
      : last_(last_step), local_(local) {}
  void after_step(const StepInfo& s) override;
  bool stop_requested() const override { return stop_; }

 private:
  int64_t last_;
  bool local_;
  bool stop_ = false;
};

// Calls `fn` every N local steps (and, with `at_end`, once more at the end).
class EveryNStepsHook : public TrainingHook {
 public:
  EveryNStepsHook(int every_n, std::function<void(const StepInfo&)> fn, bool at_end = false)
      : every_n_(every_n), fn_(std::move(fn)), at_end_(at_end) {}
  void after_step(const StepInfo& s) override;
  void end(const StepInfo& s) override;

 private:
  int every_n_;
  std::function<void(const StepInfo&)> fn_;
  bool at_end_;
  int64_t last_called_ = -1;
};

// Every N local steps, Client::report(): the worker's step, loss, accuracy,
// samples/s and learning rate on psd's /metrics and status page.
class ReportHook : public TrainingHook {
 public:
  ReportHook(Client& client, int every_n) : client_(client), every_n_(std::max(1, every_n)) {}
  void begin() override;
  void after_step(const StepInfo& s) override;

 private:
  Client& client_;
  int every_n_;
  std::chrono::steady_clock::time_point last_t_;
  int64_t last_local_ = 0;
};

// "1h02m03s", "4m05s", "12.3s".
std::string format_duration(double seconds);
// "123.4k", "1.23M".
std::string format_rate(double per_second);

}  // namespace ps
