// psd's metrics in the Prometheus text exposition format 0.0.4, for /metrics.
// Reads the shard's state, so it runs on the KJ event-loop thread.
//
// Families (all prefixed ps_): requests_total{kind}, requests_rejected_total,
// tensors_{pushed,pulled,created}_total, {received,sent}_bytes_total,
// stale_gradients_total, sync_steps_applied_total, staleness_waits_total,
// global_step, connections, connected_workers, tensors, tensor_bytes,
// job_ready, memory_budget_bytes, memory_used_bytes{use}, memory_refusals_total,
// worker_{step,connected,pushes_total}{worker},
// worker_{reported_step,loss,accuracy,samples_per_second,learning_rate}{worker}
// (once a worker reported), apply_latency_seconds and push_staleness_steps
// (histograms), last_checkpoint_step and last_checkpoint_age_seconds (-1
// until a checkpoint exists), shard_info{shard,num_shards,mode,version}.
#pragma once

#include <string>

#include "server/shard.h"

namespace ps {

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string prometheus_text(const Shard& shard, double now_unix_secs);

}  // namespace ps
