#include "server/ps_task.h"

#include <spdlog/spdlog.h>

namespace ps {

void add_ps_task_flags(CLI::App& app, PsTaskFlags& f) {
  add_psd_flags(app, f.options, f.values, PsdFrontDoor::kTrainer);
}

void apply_log_level(const PsTaskFlags& f) {
  // A trainer with its own --log_level: its value, copied into psd's.
  for (const auto& take : f.values.take_shared) take();
  apply_log_level(f.values.log_level);
}

int run_ps_task(int task_index, int num_ps, const std::string& me, PsTaskFlags& f) {
  ServerOptions& o = f.options;
  finish_psd_flags(o, f.values,
                   PsdPlace{.task_index = task_index, .num_ps = num_ps, .address = me});
  spdlog::info("ps task {} of {}: serving shard {} on {} (bind {}{}{})", task_index, num_ps,
               o.shard.shard_index, me, o.bind,
               o.checkpoint.dir.empty() ? ", no --checkpoint_dir: a restart starts empty"
                                        : ", checkpoints in " + o.checkpoint.dir,
               f.values.nice ? ", nice " + std::to_string(*f.values.nice) : std::string());
  if (!serve_until_signal(o)) {
    spdlog::error("ps task {} exited without its final checkpoint (exit 3)", task_index);
    return 3;
  }
  spdlog::info("ps task {} exited cleanly", task_index);
  return 0;
}

}  // namespace ps
