#include "ps/job.h"

namespace ps {

std::string to_string(const JobConfig& c) {
  switch (c.mode) {
    case SyncMode::kAsync: return "async";
    case SyncMode::kSync:
      return "sync (aggregate " + std::to_string(c.replicas_to_aggregate) + " of " + std::to_string(c.total_replicas) + ")";
    case SyncMode::kBoundedStaleness: return "bounded staleness " + std::to_string(c.max_staleness);
  }
  return "?";
}

}  // namespace ps
