// The JSON behind psd's status page (/status.json): the shard, its tensors,
// the workers with their step, lag and last report, and the progress history
// for the charts. Event-loop thread only (reads the job state).
#pragma once

#include <string>

#include "server/progress_history.h"
#include "server/shard.h"

namespace ps {

// The job as this shard sees it: the fraction of its stop step reached
// (NaN without one), global steps per second over the last 10 s of
// `history` (NaN before a second of it), the seconds left at that rate (0
// once finished; NaN when unknown), and the samples per second the connected
// workers last reported, summed.
struct JobProgress {
  double fraction = 0;
  double steps_per_sec = 0;
  double eta_secs = 0;
  double samples_per_sec = 0;
};
JobProgress job_progress(const Shard& shard, const ProgressHistory& history, double now_unix_secs);

// The shard's progress now, as one history sample.
ProgressSample sample_progress(const Shard& shard, double now_unix_secs);

std::string status_json(const Shard& shard, const ProgressHistory& history, double now_unix_secs);

}  // namespace ps
