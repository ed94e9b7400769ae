#include "server/status_json.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/utf8_text.h"

namespace ps {
namespace {

// Tensor names come from clients: escape everything JSON requires, and
// bytes that are not UTF-8 (JSON text must be) as U+FFFD.
std::string quote(const std::string& s) {
  std::string out(1, '"');
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\u{:04x}", c);
    else
      out.append(s, i, n);
    i += n;
  }
  out += '"';
  return out;
}

// JSON has no NaN or Infinity.
std::string number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

const char* mode_name(SyncMode m) {
  switch (m) {
    case SyncMode::kAsync:
      return "async";
    case SyncMode::kSync:
      return "sync";
    case SyncMode::kBoundedStaleness:
      return "bounded staleness";
  }
  return "?";
}

// Seconds of history the rates (and the ETA) are measured over.
constexpr double kRateWindowSecs = 10;

}  // namespace

JobProgress job_progress(const Shard& shard, const ProgressHistory& history, double now_unix_secs) {
  const JobState& job = shard.job();
  JobProgress p;
  const int64_t step = job.global_step();
  const int64_t stop = job.config().train_steps;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  p.fraction =
      stop > 0 ? std::min(1.0, static_cast<double>(step) / static_cast<double>(stop)) : nan;
  // The oldest sample inside the window against now.
  p.steps_per_sec = nan;
  for (const ProgressSample& s : history.samples()) {
    const double dt = now_unix_secs - s.unix_secs;
    if (dt > kRateWindowSecs) continue;
    if (dt >= 1.0 && step >= s.global_step)
      p.steps_per_sec = static_cast<double>(step - s.global_step) / dt;
    break;
  }
  p.eta_secs = nan;
  if (job.finished() || (stop > 0 && step >= stop)) {
    p.eta_secs = 0;
  } else if (stop > 0 && std::isfinite(p.steps_per_sec) && p.steps_per_sec > 0) {
    p.eta_secs = static_cast<double>(stop - step) / p.steps_per_sec;
  }
  p.samples_per_sec = 0;
  for (const auto& [i, w] : job.workers()) {
    if (w.connections > 0 && w.report && std::isfinite(w.report->samples_per_sec))
      p.samples_per_sec += w.report->samples_per_sec;
  }
  return p;
}

ProgressSample sample_progress(const Shard& shard, double now_unix_secs) {
  ProgressSample s;
  s.unix_secs = now_unix_secs;
  s.global_step = shard.job().global_step();
  s.bytes = shard.counters().bytes_in + shard.counters().bytes_out;
  double sum = 0;
  int n = 0;
  for (const auto& [i, w] : shard.job().workers()) {
    if (w.report && std::isfinite(w.report->loss)) {
      sum += w.report->loss;
      ++n;
    }
  }
  s.mean_loss = n > 0 ? sum / n : std::numeric_limits<double>::quiet_NaN();
  return s;
}

std::string status_json(const Shard& shard, const ProgressHistory& history, double now_unix_secs) {
  const JobState& job = shard.job();
  const ShardCounters& c = shard.counters();
  std::string o = "{";
  o += fmt::format("\"shard\":{},\"num_shards\":{},\"version\":{},", shard.options().shard_index,
                   shard.options().num_shards, quote(PS_VERSION));
  o += fmt::format("\"mode\":{},\"job\":{},\"configured\":{},\"ready\":{},\"finished\":{},",
                   quote(mode_name(job.config().mode)), quote(to_string(job.config())),
                   job.configured(), job.ready(), job.finished());
  o += fmt::format(
      "\"global_step\":{},\"train_steps\":{},\"pushes\":{},\"pulls\":{},\"bytes_in\":{},\"bytes_"
      "out\":{},",
      job.global_step(), job.config().train_steps, c.pushes.load(), c.pulls.load(),
      c.bytes_in.load(), c.bytes_out.load());
  // Progress, rates and ETA, so the page and scripts/cluster_status need no arithmetic.
  const JobProgress p = job_progress(shard, history, now_unix_secs);
  int workers_connected = 0;
  for (const auto& [i, w] : job.workers()) workers_connected += w.connections > 0 ? 1 : 0;
  o += fmt::format(
      "\"progress\":{},\"steps_per_sec\":{},\"eta_secs\":{},\"samples_per_sec\":{},"
      "\"workers_seen\":{},\"workers_connected\":{},",
      number(p.fraction), number(p.steps_per_sec), number(p.eta_secs), number(p.samples_per_sec),
      job.workers().size(), workers_connected);
  o += fmt::format("\"stale\":{},\"rejected\":{},\"connections\":{},\"now\":{},", c.stale.load(),
                   c.rejected.load(), c.connections.load(), number(now_unix_secs));
  o += fmt::format("\"last_checkpoint_step\":{},\"last_checkpoint_unix_secs\":{},",
                   shard.last_checkpoint_step(), number(shard.last_checkpoint_unix_secs()));
  // Tensors the restore at start-up left out (bad values, a spec create refuses).
  o += "\"restore_skipped\":[";
  for (std::size_t i = 0; i < shard.restore_skipped().size(); ++i) {
    const SkippedTensor& s = shard.restore_skipped()[i];
    o += fmt::format("{}{{\"name\":{},\"reason\":{}}}", i ? "," : "", quote(s.name),
                     quote(s.reason));
  }
  o += "],";

  o += "\"waits\":[";
  for (std::size_t i = 0; i < shard.current_waits().size(); ++i) {
    if (i) o += ',';
    o += quote(shard.current_waits()[i]);
  }
  o += "],";

  o += "\"tensors\":[";
  bool first = true;
  for (const StoredTensor* t : shard.store().all()) {
    std::string shape;
    for (std::size_t i = 0; i < t->spec().shape.size(); ++i) {
      if (i) shape += ',';
      shape += std::to_string(t->spec().shape[i]);
    }
    o +=
        fmt::format("{}{{\"name\":{},\"shape\":[{}],\"bytes\":{},\"version\":{},\"trainable\":{}}}",
                    first ? "" : ",", quote(t->spec().name), shape, t->size() * sizeof(float),
                    t->version(), t->spec().trainable);
    first = false;
  }
  o += "],\"tables\":[";
  first = true;
  for (const TableReport& t : shard.list_tables()) {
    o += fmt::format(
        "{}{{\"name\":{},\"dim\":{},\"dynamic\":{},\"rows\":{},\"bytes\":{},\"version\":{},"
        "\"rows_pulled\":{},\"rows_pushed\":{},\"evictions\":{},\"ids_filtered\":{},"
        "\"rows_expired\":{}}}",
        first ? "" : ",", quote(t.spec.name), t.spec.dim, t.spec.dynamic, t.rows_here, t.bytes,
        t.version, t.rows_pulled, t.rows_pushed, t.evictions, t.ids_filtered, t.rows_expired);
    first = false;
  }
  o += "],\"workers\":[";
  first = true;
  for (const auto& [i, w] : job.workers()) {
    // lag: global step - worker step; null while the job's step is behind the
    // worker's (async workers that push but never call stepDone).
    const int64_t lag = job.global_step() - w.step;
    o += fmt::format(
        "{}{{\"index\":{},\"connected\":{},\"peer\":{},\"step\":{},\"lag\":{},\"pushes\":{},"
        "\"stale\":{}",
        first ? "" : ",", i, w.connections > 0, quote(w.peer), w.step,
        lag >= 0 ? std::to_string(lag) : "null", w.pushes, w.stale);
    if (w.report) {
      const WorkerReport& r = *w.report;
      o += fmt::format(
          ",\"report\":{{\"step\":{},\"loss\":{},\"accuracy\":{},\"samples_per_sec\":{},"
          "\"learning_rate\":{},\"age_secs\":{}}}",
          r.step, number(r.loss), number(r.accuracy), number(r.samples_per_sec),
          number(r.learning_rate), number(now_unix_secs - r.unix_secs));
    }
    o += "}";
    first = false;
  }
  // Columns rather than rows: smaller, and what the charts consume. The
  // current state is appended so the charts move between samples.
  auto samples = history.samples();
  samples.push_back(sample_progress(shard, now_unix_secs));
  std::string t, step, bytes, loss;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (i) {
      t += ',';
      step += ',';
      bytes += ',';
      loss += ',';
    }
    t += number(samples[i].unix_secs);
    step += std::to_string(samples[i].global_step);
    bytes += std::to_string(samples[i].bytes);
    loss += number(samples[i].mean_loss);
  }
  o += fmt::format("],\"history\":{{\"t\":[{}],\"step\":[{}],\"bytes\":[{}],\"loss\":[{}]}}}}", t,
                   step, bytes, loss);
  return o;
}

}  // namespace ps
