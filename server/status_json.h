// The JSON behind psd's status page (/status.json): the shard, its tensors,
// the workers with their step, lag and last report, and the progress history
// for the charts. Event-loop thread only (reads the job state).
#pragma once

#include <string>

#include "server/progress_history.h"
#include "server/shard.h"

namespace ps {

// The shard's progress now, as one history sample.
ProgressSample sample_progress(const Shard& shard, double now_unix_secs);

std::string status_json(const Shard& shard, const ProgressHistory& history, double now_unix_secs);

}  // namespace ps
