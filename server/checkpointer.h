// psd's checkpoints: every --checkpoint_secs (when something changed), on
// SIGTERM, and when the chief asks (the checkpoint RPC); restored at start.
//
// The snapshot is taken on the event loop (Shard::snapshot: per-tensor
// copies), the file is written on a thread of its own (ordinary blocking
// I/O with fsync), and the result comes back to the loop through a
// cross-thread fulfiller: the loop never waits for the disk. Writes are
// serialised; after each, all but the newest --keep_checkpoints files of the
// shard are removed.
//
// Example (server.cc):
//   Checkpointer ckpt({.dir = "/ckpt", .every_secs = 60, .keep = 3}, shard);
//   ckpt.restore();                      // before listening
//   tasks.add(ckpt.run_periodic(timer));
//   ... ckpt.checkpoint(-1) on shutdown
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <kj/async.h>
#include <kj/timer.h>

#include "common/checkpoint/checkpoint_file.h"
#include "common/memory_budget.h"

namespace ps {

class Shard;

struct CheckpointOptions {
  std::string dir;        // empty: no checkpoints
  double every_secs = 0;  // 0: only on SIGTERM and on request
  uint32_t keep = 3;
};

class Checkpointer {
 public:
  // With a `budget`, each snapshot counts against it until written; one that
  // does not fit is refused (the budget must outlive the checkpointer).
  Checkpointer(CheckpointOptions options, Shard& shard, MemoryBudget* budget = nullptr);
  ~Checkpointer();  // finishes the write in progress
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Loads the newest valid checkpoint of this shard into the (empty) shard.
  // Invalid files are logged (path and what is wrong) and skipped. Returns
  // the file loaded, or "" if there was none.
  std::string restore();

  struct Written {
    std::string path;
    int64_t step = 0;
  };
  // Snapshot at `step` (see Shard::snapshot_at_step; -1: now), then write.
  // Snapshots taken now (step -1 or a step reached) are taken one at a
  // time: each waits until the one before it is written, so pipelined
  // requests hold one copy of the shard, not one each. Each snapshot counts
  // against the memory budget from when it is taken until written; one for
  // a later step reserves nothing while it waits, and is refused when its
  // step comes if it does not fit then.
  kj::Promise<Written> checkpoint(int64_t step = -1);

  // Writes a checkpoint every every_secs when the shard changed; never
  // resolves (cancel it to stop).
  kj::Promise<void> run_periodic(kj::Timer& timer);

  const CheckpointOptions& options() const { return options_; }

 private:
  // restore() found nothing: logs a warning per other shard count whose
  // checkpoints lie in the directory (a job restarted with other --ps_hosts).
  void warn_other_shard_counts() const;
  struct Job {
    std::shared_ptr<ShardCheckpoint> checkpoint;
    std::shared_ptr<std::string>
        path;  // set by the writer (a void fulfiller: GCC 12 misreads strings in kj promises)
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> done;
  };
  kj::Promise<Written> write(std::shared_ptr<ShardCheckpoint> c);
  // Reserves the snapshot's memory, snapshots at `step` and writes it.
  // `anyway`: counted even past the budget (the one snapshot taken now at a
  // time, so that a shard whose tensors fill most of the budget can still be
  // saved); otherwise refused when it does not fit.
  kj::Promise<Written> take(int64_t step, bool anyway);
  void writer_loop();
  uint64_t change_signature() const;

  CheckpointOptions options_;
  Shard& shard_;
  MemoryBudget* budget_;
  kj::Maybe<kj::ForkedPromise<void>> previous_now_;  // the last snapshot taken now, until written
  uint64_t saved_signature_ = ~uint64_t{0};

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread writer_;
};

}  // namespace ps
