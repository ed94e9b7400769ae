#include "server/prometheus_metrics.h"

#include <cmath>

#include <fmt/format.h>

#include "common/utf8_text.h"

namespace ps {
namespace {

// A label value: escaped as the text format wants, and bytes that are not
// UTF-8 as U+FFFD (Prometheus refuses a whole scrape with one such value).
std::string escape_label(const std::string& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size();) {
    const char c = v[i];
    const std::size_t n = utf8_sequence(v, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      ++i;
      continue;
    }
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out.append(v, i, n);
    i += n;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest form that reads back exactly
}

// Appends families: a HELP and TYPE line, then that family's samples.
class Exposition {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, const std::string& labels, double value) {
    line(name, labels, format_value(value));
  }
  void sample(const std::string& name, const std::string& labels, uint64_t value) {
    line(name, labels, std::to_string(value));
  }
  void sample(const std::string& name, const std::string& labels, int64_t value) {
    line(name, labels, std::to_string(value));
  }
  void counter(const char* name, const char* help, uint64_t value) {
    family(name, "counter", help);
    sample(name, "", value);
  }
  void gauge(const char* name, const char* help, double value) {
    family(name, "gauge", help);
    sample(name, "", value);
  }
  void histogram(const char* name, const char* help, const Histogram::Snapshot& s) {
    family(name, "histogram", help);
    const std::string base = name;
    for (std::size_t i = 0; i < s.bounds.size(); ++i) {
      sample(base + "_bucket", fmt::format("le=\"{}\"", format_value(s.bounds[i])),
             s.cumulative[i]);
    }
    sample(base + "_bucket", "le=\"+Inf\"", s.cumulative.back());
    sample(base + "_sum", "", s.sum);
    sample(base + "_count", "", s.count);
  }
  std::string take() { return std::move(out_); }

 private:
  void line(const std::string& name, const std::string& labels, const std::string& value) {
    if (labels.empty())
      out_ += fmt::format("{} {}\n", name, value);
    else
      out_ += fmt::format("{}{{{}}} {}\n", name, labels, value);
  }

  std::string out_;
};

const char* mode_name(SyncMode m) {
  switch (m) {
    case SyncMode::kAsync:
      return "async";
    case SyncMode::kSync:
      return "sync";
    case SyncMode::kBoundedStaleness:
      return "bounded_staleness";
  }
  return "?";
}

std::string worker_label(int index) { return fmt::format("worker=\"{}\"", index); }

}  // namespace

std::string prometheus_text(const Shard& shard, double now_unix_secs) {
  const ShardCounters& c = shard.counters();
  const JobState& job = shard.job();
  Exposition e;

  e.family("ps_shard_info", "gauge",
           "This shard: index, shard count, job mode and psd version (value 1).");
  e.sample("ps_shard_info",
           fmt::format("shard=\"{}\",num_shards=\"{}\",mode=\"{}\",version=\"{}\"",
                       shard.options().shard_index, shard.options().num_shards,
                       mode_name(job.config().mode), escape_label(PS_VERSION)),
           uint64_t{1});

  e.family("ps_requests_total", "counter",
           "RPC requests received, by method (refused ones included).");
  for (std::size_t k = 0; k < kRequestKinds; ++k) {
    e.sample("ps_requests_total",
             fmt::format("kind=\"{}\"", request_kind_name(static_cast<RequestKind>(k))),
             c.requests[k].load());
  }
  e.counter("ps_requests_rejected_total", "RPC requests refused as bad input.", c.rejected);
  e.counter("ps_tensors_pushed_total", "Gradients received (one per tensor in a push).", c.pushes);
  e.counter("ps_tensors_pulled_total", "Tensors read by pulls.", c.pulls);
  e.counter("ps_tensors_created_total", "Tensors in create requests (existing ones included).",
            c.creates);
  e.counter("ps_received_bytes_total", "Gradient payload bytes received by pushes.", c.bytes_in);
  e.counter("ps_sent_bytes_total", "Tensor payload bytes sent by pulls.", c.bytes_out);
  e.counter("ps_shared_memory_bytes_total",
            "Of the bytes received and sent, those moved through memory shared with a client on "
            "this host.",
            c.shared_bytes);
  e.counter("ps_stale_gradients_total",
            "Sync mode: gradients dropped as stale (backup workers' included).", c.stale);
  e.counter("ps_sync_steps_applied_total", "Sync mode: aggregated steps applied.", c.steps_applied);
  e.counter("ps_staleness_waits_total",
            "Bounded staleness: pulls that had to wait for the slowest worker.",
            job.staleness_waits());

  e.gauge("ps_global_step", "The job's global step on this shard.",
          static_cast<double>(job.global_step()));
  e.gauge("ps_connections", "Open RPC connections (workers and tools).", c.connections.load());
  e.gauge("ps_connected_workers", "Workers with at least one open connection.", job.live_workers());
  e.gauge("ps_tensors", "Tensors (or tensor parts) stored.",
          static_cast<double>(shard.store().count()));
  e.gauge("ps_tensor_bytes", "Bytes of tensor values stored (optimizer slots not counted).",
          static_cast<double>(shard.store().bytes()));
  if (const MemoryBudget* budget = shard.memory_budget()) {
    e.gauge("ps_memory_budget_bytes", "psd's memory budget (--max_memory_mb).",
            static_cast<double>(budget->limit()));
    e.family("ps_memory_used_bytes", "gauge", "Memory counted against the budget, by use.");
    for (unsigned u = 0; u < static_cast<unsigned>(MemoryUse::kCount); ++u) {
      e.sample("ps_memory_used_bytes",
               fmt::format("use=\"{}\"", memory_use_name(static_cast<MemoryUse>(u))),
               budget->used(static_cast<MemoryUse>(u)));
    }
    e.counter("ps_memory_refusals_total",
              "Requests, tensors and snapshots refused for lack of memory budget.",
              budget->refusals());
  }
  e.gauge("ps_job_ready", "1 once the chief has initialised the model.", job.ready() ? 1 : 0);

  // Embedding tables, labelled by table.
  const std::vector<TableReport> tables = shard.list_tables();
  struct TableField {
    const char* name;
    const char* type;
    const char* help;
    uint64_t (*get)(const TableReport&);
  };
  const TableField table_fields[] = {
      {"ps_table_rows", "gauge", "Rows of each embedding table held on this shard.",
       [](const TableReport& t) { return t.rows_here; }},
      {"ps_table_bytes", "gauge",
       "Memory of each embedding table on this shard: rows, optimizer slots and index.",
       [](const TableReport& t) { return t.bytes; }},
      {"ps_table_rows_pulled_total", "counter", "Rows read by pullRows, per table.",
       [](const TableReport& t) { return t.rows_pulled; }},
      {"ps_table_rows_pushed_total", "counter", "Row gradients received by pushRows, per table.",
       [](const TableReport& t) { return t.rows_pushed; }},
      {"ps_table_evictions_total", "counter",
       "Rows evicted from a dynamic table at its row limit (evict-LRU).",
       [](const TableReport& t) { return t.evictions; }},
      {"ps_table_ids_filtered_total", "counter",
       "Pushed ids of a dynamic table not yet admitted (min_count): their gradients dropped.",
       [](const TableReport& t) { return t.ids_filtered; }},
      {"ps_table_rows_expired_total", "counter",
       "Rows of a dynamic table dropped untouched for expire_after_steps global steps.",
       [](const TableReport& t) { return t.rows_expired; }},
  };
  for (const auto& f : table_fields) {
    e.family(f.name, f.type, f.help);
    for (const auto& t : tables)
      e.sample(f.name, fmt::format("table=\"{}\"", escape_label(t.spec.name)), f.get(t));
  }

  const auto& workers = job.workers();
  e.family("ps_worker_step", "gauge",
           "Each worker's last step (stepDone, or the step of its last push).");
  for (const auto& [i, w] : workers) e.sample("ps_worker_step", worker_label(i), w.step);
  e.family("ps_worker_connected", "gauge", "1 while the worker has an open connection.");
  for (const auto& [i, w] : workers)
    e.sample("ps_worker_connected", worker_label(i), uint64_t(w.connections > 0));
  e.family("ps_worker_pushes_total", "counter", "Gradients received from each worker.");
  for (const auto& [i, w] : workers) e.sample("ps_worker_pushes_total", worker_label(i), w.pushes);

  // From the report RPC; absent for workers that never reported.
  struct ReportField {
    const char* name;
    const char* help;
    double (*get)(const WorkerReport&);
  };
  const ReportField fields[] = {
      {"ps_worker_reported_step", "Step in the worker's last report.",
       [](const WorkerReport& r) { return double(r.step); }},
      {"ps_worker_loss", "Training loss in the worker's last report.",
       [](const WorkerReport& r) { return double(r.loss); }},
      {"ps_worker_accuracy", "Accuracy in the worker's last report.",
       [](const WorkerReport& r) { return double(r.accuracy); }},
      {"ps_worker_samples_per_second", "Throughput in the worker's last report.",
       [](const WorkerReport& r) { return double(r.samples_per_sec); }},
      {"ps_worker_learning_rate", "Learning rate in the worker's last report.",
       [](const WorkerReport& r) { return double(r.learning_rate); }},
  };
  for (const auto& f : fields) {
    e.family(f.name, "gauge", f.help);
    for (const auto& [i, w] : workers) {
      if (w.report) e.sample(f.name, worker_label(i), f.get(*w.report));
    }
  }

  e.histogram("ps_apply_latency_seconds",
              "Time to apply one gradient (or a sync step's average) to one tensor.",
              shard.apply_latency().snapshot());
  e.histogram(
      "ps_push_staleness_steps",
      "Per worker push: sync: global step minus the gradient's step; async and bounded staleness: "
      "the worker's step minus the slowest connected worker's step.",
      shard.push_staleness().snapshot());

  const bool have_checkpoint = shard.last_checkpoint_step() >= 0;
  e.gauge("ps_last_checkpoint_step",
          "Global step of the last checkpoint written; -1 before the first.",
          static_cast<double>(shard.last_checkpoint_step()));
  e.gauge(
      "ps_last_checkpoint_age_seconds",
      "Seconds since the last checkpoint was written; -1 before the first.",
      have_checkpoint ? std::max(0.0, now_unix_secs - shard.last_checkpoint_unix_secs()) : -1.0);
  return e.take();
}

}  // namespace ps
