#include "ps/job.h"

namespace ps {

std::string to_string(const JobConfig& c) {
  std::string s;
  switch (c.mode) {
    case SyncMode::kAsync:
      s = "async";
      break;
    case SyncMode::kSync:
      s = "sync (aggregate " + std::to_string(c.replicas_to_aggregate) + " of " +
          std::to_string(c.total_replicas) + ")";
      break;
    case SyncMode::kBoundedStaleness:
      s = "bounded staleness " + std::to_string(c.max_staleness);
      break;
  }
  // Two jobs that differ only here read alike without them ("async, not async").
  if (c.mode != SyncMode::kSync && c.total_replicas > 0)
    s += ", " + std::to_string(c.total_replicas) + " workers";
  if (c.train_steps > 0) s += ", stop at step " + std::to_string(c.train_steps);
  return s;
}

const char* sync_mode_name(SyncMode mode) {
  switch (mode) {
    case SyncMode::kSync:
      return "sync";
    case SyncMode::kBoundedStaleness:
      return "bounded-staleness";
    case SyncMode::kAsync:
      break;
  }
  return "async";
}

}  // namespace ps
