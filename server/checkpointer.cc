#include "server/checkpointer.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include <spdlog/spdlog.h>

#include "ps/checkpoint.h"
#include "ps/errors.h"
#include "server/shard.h"

namespace ps {

Checkpointer::Checkpointer(CheckpointOptions options, Shard& shard, MemoryBudget* budget)
    : options_(std::move(options)),
      shard_(shard),
      budget_(budget),
      writer_([this] { writer_loop(); }) {}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

void Checkpointer::writer_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left to write
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      bool kept_fuller = false;
      *job.path = write_checkpoint(options_.dir, *job.checkpoint, &kept_fuller);
      if (kept_fuller) {
        spdlog::warn(
            "checkpoint of step {} has {} tensors, fewer than the file of that step already there: "
            "that file "
            "is kept, this one written to {}",
            job.checkpoint->global_step, job.checkpoint->tensors.size(), *job.path);
      }
      prune_checkpoints(options_.dir, job.checkpoint->shard_index, job.checkpoint->num_shards,
                        options_.keep, job.checkpoint->global_step);
      job.done->fulfill();
    } catch (const std::exception& e) {
      job.done->reject(
          kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(e.what())));
    }
  }
}

kj::Promise<Checkpointer::Written> Checkpointer::write(std::shared_ptr<ShardCheckpoint> c) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  auto path = std::make_shared<std::string>();
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({c, path, kj::mv(paf.fulfiller)});
  }
  wake_.notify_one();
  const int64_t step = c->global_step;
  const double secs = c->unix_secs;
  return paf.promise.then([this, step, secs, path] {
    shard_.counters().last_checkpoint_step = step;
    shard_.counters().last_checkpoint_unix_secs = secs;
    spdlog::info("checkpoint of step {} written: {}", step, *path);
    return Written{*path, step};
  });
}

kj::Promise<Checkpointer::Written> Checkpointer::checkpoint(int64_t step) {
  if (options_.dir.empty()) throw RequestError("checkpoint: this psd has no --checkpoint_dir");
  if (step >= 0 && step > shard_.job().global_step())
    return kj::evalNow([this, step] { return take(step, false); });
  kj::Promise<void> before = kj::READY_NOW;
  KJ_IF_MAYBE (p, previous_now_) {
    before = p->addBranch();
  }
  auto mine = before.then([this, step] { return take(step, true); }).fork();
  previous_now_ = mine.addBranch()
                      .ignoreResult()
                      .catch_([](kj::Exception&&) {})
                      .eagerlyEvaluate(nullptr)
                      .fork();
  return mine.addBranch();
}

kj::Promise<Checkpointer::Written> Checkpointer::take(int64_t step, bool anyway) {
  // Reserved as the snapshot is taken: a wait for a later step holds none.
  auto reservation = std::make_shared<MemoryBudget::Reservation>();
  auto reserve = [this, anyway, reservation]() -> std::string {
    if (budget_ == nullptr) return "";
    uint64_t bytes = 0;
    for (const StoredTensor* t : shard_.store().all())
      bytes += t->size() * sizeof(float) * (1 + t->num_slots());
    *reservation = anyway ? budget_->reserve_anyway(MemoryUse::kSnapshots, bytes)
                          : budget_->try_reserve(MemoryUse::kSnapshots, bytes);
    if (*reservation) return "";
    return "checkpoint: no memory for a snapshot of " + std::to_string(bytes >> 20) +
           " MiB now: " + budget_->describe();
  };
  const bool later = step >= 0 && step > shard_.job().global_step();
  if (!later) {
    const std::string refusal = reserve();
    if (!refusal.empty()) throw RequestError(refusal);
  }
  const uint64_t signature = change_signature();
  return shard_.snapshot_at_step(step, later ? std::function<std::string()>(reserve) : nullptr)
      .then([this, signature](std::shared_ptr<ShardCheckpoint> c) {
        // Saved only once written: a failed write (disk full, a bad directory)
        // is tried again at the next period even if nothing changes, so an idle
        // job's state is still saved once the disk allows it.
        return write(kj::mv(c)).then([this, signature](Written w) {
          saved_signature_ = signature;
          return w;
        });
      })
      .attach(kj::mv(reservation));
}

uint64_t Checkpointer::change_signature() const {
  // Anything that changes what a checkpoint holds changes one of these.
  auto& c = shard_.counters();
  return c.pushes * 1000003u + c.creates * 10007u +
         static_cast<uint64_t>(shard_.job().global_step()) * 101u +
         (shard_.job().ready() ? 1u : 0u) + (shard_.job().configured() ? 2u : 0u);
}

kj::Promise<void> Checkpointer::run_periodic(kj::Timer& timer) {
  const auto delay = static_cast<int64_t>(options_.every_secs * 1000) * kj::MILLISECONDS;
  return timer.afterDelay(delay)
      .then([this] {
        if (change_signature() == saved_signature_) return kj::Promise<void>(kj::READY_NOW);
        return checkpoint(-1).then([](Written) {},
                                   [](kj::Exception&& e) {
                                     spdlog::error("periodic checkpoint failed: {}",
                                                   e.getDescription().cStr());
                                   });
      })
      .then([this, &timer] { return run_periodic(timer); });
}

std::string Checkpointer::restore() {
  const ShardOptions& o = shard_.options();
  for (const auto& file : list_checkpoints(options_.dir, o.shard_index, o.num_shards)) {
    try {
      ShardCheckpoint c = read_checkpoint(file.path);
      if (c.global_step != file.step)
        throw CheckpointError("checkpoint " + file.path + " holds step " +
                              std::to_string(c.global_step));
      const std::vector<SkippedTensor> skipped = shard_.restore(c);
      saved_signature_ = change_signature();
      for (const auto& s : skipped) {
        spdlog::error("restore of {}: left out tensor '{}': {}", file.path, s.name, s.reason);
      }
      spdlog::info("restored {}: global step {}, {} of {} tensors{}{}", file.path, c.global_step,
                   c.tensors.size() - skipped.size(), c.tensors.size(),
                   c.ready ? "" : " (model not marked ready)",
                   skipped.empty()
                       ? ""
                       : " (the file is kept: later checkpoints of this step do not replace it)");
      return file.path;
    } catch (const CheckpointError& e) {
      // Unreadable (truncated, corrupted, another format): set aside, so
      // that its newer step does not keep this run's checkpoints from being
      // the newest (pruning would take them instead).
      const std::string aside = file.path + ".unreadable";
      std::rename(file.path.c_str(), aside.c_str());
      spdlog::error("skipping checkpoint {}: {} (moved to {})", file.path, e.what(), aside);
    } catch (const std::exception& e) {
      spdlog::error("skipping checkpoint {}: {}", file.path, e.what());
    }
  }
  spdlog::info("no checkpoint to restore in {}",
               shard_checkpoint_dir(options_.dir, o.shard_index, o.num_shards));
  warn_other_shard_counts();
  return "";
}

void Checkpointer::warn_other_shard_counts() const {
  // Checkpoints of a job with another number of shards are not this
  // shard's to restore: say so, rather than start empty beside them.
  const uint32_t shards = shard_.options().num_shards;
  std::map<uint32_t, int64_t> newest;  // shard count -> newest step
  for (const auto& file : list_all_checkpoints(options_.dir)) {
    if (file.num_shards == shards) continue;
    auto [it, added] = newest.try_emplace(file.num_shards, file.step);
    if (!added) it->second = std::max(it->second, file.step);
  }
  for (const auto& [count, step] : newest) {
    spdlog::warn(
        "{} holds checkpoints of a job of {} ps shards (newest step {}), and this psd is one of {}: "
        "it starts empty. To go on from them, start {} psd tasks (--ps_hosts with {} hosts), or "
        "restore them into {} from the chief (TrainingSession's restore_from = {}; "
        "docs/training.md, Re-sharding)",
        options_.dir, count, step, shards, count, count, shards, options_.dir);
  }
}

}  // namespace ps
