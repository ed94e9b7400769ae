// psd's entry point inside a trainer started with --job_name=ps (TensorFlow's
// one-program-per-role style): the same flags (server/psd_flags.h) and the
// same server as the psd program, the shard and its address taken from the
// trainer's cluster. It serves until SIGTERM/SIGINT or, by default, until the
// chief finished the job and every worker left.
//
//   ps::TrainerFlags f;
//   ps::add_trainer_flags(app, f);
//   ps::PsTaskFlags ps_flags;
//   ps::add_ps_task_flags(app, ps_flags);   // after the trainer's flags
//   ...
//   ps::apply_log_level(ps_flags);
//   if (spec.is_ps()) return ps::run_ps_task(spec.task_index(), spec.num_ps(), spec.self_address(),
//   ps_flags);
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "server/psd_flags.h"
#include "server/server.h"

namespace ps {

struct PsTaskFlags {
  ServerOptions options;
  PsdFlagValues values;
};

// psd's flags (PsdFrontDoor::kTrainer): all but those the cluster decides,
// sharing the ones the trainer already has.
void add_ps_task_flags(CLI::App& app, PsTaskFlags& flags);

// Applies --log_level (both roles use it). Throws ConfigError.
void apply_log_level(const PsTaskFlags& flags);

// Serves shard `task_index` of `num_ps` on `self_address` ("host:port" as a
// ClusterSpec checked it, or "unix:/path"). Returns the exit code (0 after a
// clean stop); throws ConfigError.
int run_ps_task(int task_index, int num_ps, const std::string& self_address, PsTaskFlags& flags);

}  // namespace ps
