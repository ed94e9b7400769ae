// psd's command-line flags (the psd program; a trainer run with --job_name=ps
// has its own, examples/ps_task.cc).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "server/server.h"

namespace ps {

struct PsdFlagValues {
  std::string ps_hosts;
  int task_index = -1;
  std::string log_level = "info";
  double max_message_mb = 80;
  double max_tensor_mb = 4096;
  double max_memory_mb = 0;  // 0: MemoryBudget::default_limit()
  double hello_timeout_secs = 10;
  double request_timeout_secs = 30;
  int max_shared_memory_mb = 1024;
  std::string http_port = "0";  // 0: no HTTP; "any": a free port
  std::string auth_token_file;
  std::string http_auth_token_file;
  std::optional<int> nice;  // unset: the priority psd was started with
};

// Registers the flags; their values land in `options` (and in `extra`, kept
// alive by the caller, for values that need post-processing).
void add_psd_flags(CLI::App& app, ServerOptions& options, PsdFlagValues& extra);

// Derives shard index/count and port from --ps_hosts/--task_index when given,
// applies --log_level, --nice and the size limits. Throws ConfigError.
void finish_psd_flags(ServerOptions& options, const PsdFlagValues& extra);

}  // namespace ps
