#include "ps/hooks.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "ps/client.h"
#include "ps/summary_writer.h"

namespace ps {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  const auto total = static_cast<int64_t>(s + 0.5);
  if (total < 3600) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}h{:02}m{:02}s", total / 3600, total / 60 % 60, total % 60);
}

std::string format_rate(double r) {
  if (!std::isfinite(r)) return "?";
  if (r >= 1e6) return fmt::format("{:.2f}M", r / 1e6);
  if (r >= 1e3) return fmt::format("{:.1f}k", r / 1e3);
  return fmt::format("{:.0f}", r);
}

// --- HookList ---
void HookList::begin() {
  for (auto& h : hooks_) h->begin();
}
void HookList::after_step(const StepInfo& s) {
  // The local step of the call before: no step ran (run_step() found the
  // job done). Local step 0 passes, for loops that do not count it.
  if (s.local_step > 0 && s.local_step == last_local_) return;
  last_local_ = s.local_step;
  for (auto& h : hooks_) h->after_step(s);
}
void HookList::end(const StepInfo& s) {
  for (auto& h : hooks_) h->end(s);
}
bool HookList::stop_requested() const {
  return std::any_of(hooks_.begin(), hooks_.end(),
                     [](const auto& h) { return h->stop_requested(); });
}

// --- LoggingHook ---
LoggingHook::LoggingHook(Options o) : o_(o) {}

LoggingHook::~LoggingHook() {
  if (own_tty_) std::fclose(own_tty_);
}

void LoggingHook::begin() {
  start_ = std::chrono::steady_clock::now();
  const char* term = std::getenv("TERM");
  const bool term_ok = term && std::string(term) != "dumb";
  if (o_.progress_bar && o_.bar_stream && !::isatty(::fileno(o_.bar_stream)) && term_ok &&
      !own_tty_) {
    // Streams going through a pipe: a launcher may name the terminal.
    const char* path = std::getenv("PS_PROGRESS_TTY");
    if (path && *path) {
      own_tty_ = std::fopen(path, "w");
      if (own_tty_ && !::isatty(::fileno(own_tty_))) {
        std::fclose(own_tty_);
        own_tty_ = nullptr;
      }
      if (own_tty_) o_.bar_stream = own_tty_;
    }
  }
  tty_ = o_.progress_bar && o_.bar_stream && ::isatty(::fileno(o_.bar_stream)) && term_ok;
}

void LoggingHook::clear_bar() {
  if (bar_drawn_) {
    std::fputs("\r\033[K", o_.bar_stream);
    std::fflush(o_.bar_stream);
    bar_drawn_ = false;
  }
}

void LoggingHook::draw_bar(const StepInfo& s, double now) {
  const int width = 30;
  std::string line;
  if (s.train_steps > 0) {
    const double frac = std::clamp(static_cast<double>(s.global_step) / s.train_steps, 0.0, 1.0);
    const int filled = static_cast<int>(frac * width);
    std::string bar(filled, '#');
    bar.resize(width, '.');
    const double done = s.global_step - std::max<int64_t>(first_global_, 0);
    const double rate = now > 0 ? done / now : 0;
    const double eta = rate > 0 ? (s.train_steps - s.global_step) / rate : NAN;
    line = fmt::format("[{}] {:3.0f}% step {}/{} loss {:.4f} epoch {:.2f} ETA {}", bar, frac * 100,
                       s.global_step, s.train_steps, s.loss, s.epoch, format_duration(eta));
  } else {
    line = fmt::format("step {} loss {:.4f} epoch {:.2f} {}", s.global_step, s.loss, s.epoch,
                       format_duration(now));
  }
  std::fprintf(o_.bar_stream, "\r\033[K%s", line.c_str());
  std::fflush(o_.bar_stream);
  bar_drawn_ = true;
}

void LoggingHook::after_step(const StepInfo& s) {
  if (first_global_ < 0) {
    // A worker may join a job at any step (a restarted chief): its rates
    // count from there, not from 0.
    first_global_ = s.global_step - 1;
    last_global_ = first_global_;
  }
  const double now = seconds_since(start_);
  if (o_.every_n > 0 && s.local_step % o_.every_n == 0) {
    const double dt = std::max(now - last_line_t_, 1e-9);
    const double local_rate = static_cast<double>(s.local_step - last_local_) * s.batch_size / dt;
    const double job_rate =
        static_cast<double>(s.global_step - last_global_) * s.examples_per_global_step / dt;
    // A step that went back (a ps restored from a checkpoint) has no rate.
    const std::string job =
        s.global_step >= last_global_ ? format_rate(job_rate) : "n/a, step went back";
    clear_bar();
    std::string steps = s.train_steps > 0 ? fmt::format("{}/{}", s.global_step, s.train_steps)
                                          : fmt::format("{}", s.global_step);
    std::string acc = s.accuracy >= 0 ? fmt::format(" | acc {:.3f}", s.accuracy) : "";
    std::fprintf(o_.stream,
                 "worker %d | epoch %.2f | global step %s | local step %lld | loss %.4f%s | %s "
                 "samples/s (job %s)%s\n",
                 o_.worker, s.epoch, steps.c_str(), static_cast<long long>(s.local_step), s.loss,
                 acc.c_str(), format_rate(local_rate).c_str(), job.c_str(),
                 s.stale_steps ? fmt::format(" | stale {}", s.stale_steps).c_str() : "");
    std::fflush(o_.stream);
    last_line_t_ = now;
    last_local_ = s.local_step;
    last_global_ = s.global_step;
  }
  if (tty_ && now - last_bar_t_ >= 0.1) {
    draw_bar(s, now);
    last_bar_t_ = now;
  }
}

void LoggingHook::end(const StepInfo& s) {
  if (tty_) {
    draw_bar(s, seconds_since(start_));
    std::fputc('\n', o_.bar_stream);
    bar_drawn_ = false;
  }
}

// --- SummaryHook ---
SummaryHook::SummaryHook(SummaryWriter& writer, int every_n)
    : writer_(writer), every_n_(std::max(1, every_n)) {}

void SummaryHook::begin() { last_t_ = std::chrono::steady_clock::now(); }

void SummaryHook::after_step(const StepInfo& s) {
  loss_sum_ += s.loss;
  if (s.accuracy >= 0) {  // -1: this step measured none
    acc_sum_ += s.accuracy;
    ++acc_n_;
  }
  ++n_;
  // Rates count from the step before this worker's first (a restarted
  // chief joins a job far from step 0).
  if (last_global_ < 0) last_global_ = s.global_step - 1;
  if (s.local_step % every_n_ != 0) return;
  const double dt = std::max(seconds_since(last_t_), 1e-9);
  const double steps_per_s = static_cast<double>(s.global_step - last_global_) / dt;
  writer_.add_scalar("loss", static_cast<float>(loss_sum_ / n_), s.global_step);
  if (acc_n_ > 0)
    writer_.add_scalar("accuracy/train", static_cast<float>(acc_sum_ / acc_n_), s.global_step);
  writer_.add_scalar("learning_rate", s.learning_rate, s.global_step);
  if (s.global_step > last_global_) {  // not after a ps went back to a checkpoint's step
    writer_.add_scalar("global_step/sec", static_cast<float>(steps_per_s), s.global_step);
    writer_.add_scalar("samples/sec", static_cast<float>(steps_per_s * s.examples_per_global_step),
                       s.global_step);
  }
  writer_.add_scalar("stale_gradients", static_cast<float>(s.stale_steps), s.global_step);
  last_t_ = std::chrono::steady_clock::now();
  last_global_ = s.global_step;
  loss_sum_ = acc_sum_ = 0;
  n_ = acc_n_ = 0;
}

void SummaryHook::end(const StepInfo&) { writer_.flush(); }

// --- ReportHook ---
void ReportHook::begin() { last_t_ = std::chrono::steady_clock::now(); }

void ReportHook::after_step(const StepInfo& s) {
  if (s.local_step % every_n_ != 0) return;
  const double dt = std::max(seconds_since(last_t_), 1e-9);
  const double rate = static_cast<double>(s.local_step - last_local_) * s.batch_size / dt;
  client_.report(s.global_step, static_cast<float>(s.loss),
                 static_cast<float>(std::max(0.0, s.accuracy)), static_cast<float>(rate),
                 s.learning_rate);
  last_t_ = std::chrono::steady_clock::now();
  last_local_ = s.local_step;
}

// --- StopAtStepHook, EveryNStepsHook ---
void StopAtStepHook::after_step(const StepInfo& s) {
  if ((local_ ? s.local_step : s.global_step) >= last_) stop_ = true;
}

void EveryNStepsHook::after_step(const StepInfo& s) {
  if (every_n_ > 0 && s.local_step % every_n_ == 0) {
    fn_(s);
    last_called_ = s.local_step;
  }
}

void EveryNStepsHook::end(const StepInfo& s) {
  if (at_end_ && last_called_ != s.local_step) fn_(s);
}

}  // namespace ps
