// psd's command-line flags, defined once for both front doors: the psd
// program (server/psd_main.cc) and a trainer run with --job_name=ps
// (server/ps_task.h). A flag means the same thing in both.
//
//   CLI::App app{"psd"};
//   ps::ServerOptions options;
//   ps::PsdFlagValues extra;
//   ps::add_psd_flags(app, options, extra);               // psd
//   PS_PARSE_FLAGS(app, argc, argv);
//   ps::finish_psd_flags(options, extra);                 // throws ConfigError
//
// In a trainer (PsdFrontDoor::kTrainer) the cluster names the shard and its
// address, so --port, --unix_socket, --shard_index, --num_shards, --ps_hosts
// and --task_index are not registered here; a flag the trainer already has
// (--auth_token_file, --busy_poll_us, --dead_peer_secs, --log_level) is
// shared: registered once, by the trainer, and its value also sets psd's.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "server/server.h"

namespace ps {

enum class PsdFrontDoor { kPsd, kTrainer };

struct PsdFlagValues {
  PsdFrontDoor door = PsdFrontDoor::kPsd;
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
  std::optional<int> nice;                       // unset: the priority psd was started with
  const CLI::Option* ps_hosts_option = nullptr;  // count() > 0: --ps_hosts given, even empty
  // psd: the flags that name the shard (--port, --shard_index, ...); any one
  // given makes psd ignore TF_CONFIG and Slurm (server/psd_environment.h).
  std::vector<const CLI::Option*> place_options;
  int slurm_num_ps = 1;     // under Slurm: the first N tasks are ps (as the trainers' flag)
  int port_base = 2222;     // under Slurm: task ports start here (as the trainers' flag)
  bool bind_given = false;  // --bind on the command line (else it follows the shard's host)
  // Shared flags (kTrainer): copy the trainer's value into psd's where given.
  std::vector<std::function<void()>> take_shared;
};

// Registers the flags; their values land in `options` (and in `extra`, kept
// alive by the caller, for values that need post-processing). With
// kTrainer, call after the trainer registered its own flags.
void add_psd_flags(CLI::App& app, ServerOptions& options, PsdFlagValues& extra,
                   PsdFrontDoor door = PsdFrontDoor::kPsd);

// Where a trainer's ps task serves: shard `task_index` of `num_ps` at
// `address` ("host:port" or "unix:/path"), from its ClusterSpec.
struct PsdPlace {
  int task_index = 0;
  int num_ps = 1;
  std::string address;
};

// Derives shard index/count and port from --ps_hosts/--task_index (or from
// `place`, a trainer's ps task; psd without cluster flags reads TF_CONFIG or
// Slurm's variables, server/psd_environment.h), applies --log_level, --nice
// and the size limits. Without --bind, a shard whose address names a loopback host
// listens on 127.0.0.1 and any other on 0.0.0.0. Throws ConfigError.
void finish_psd_flags(ServerOptions& options, PsdFlagValues& extra,
                      const std::optional<PsdPlace>& place = {});

// Sets spdlog's level; ConfigError for a name it does not know (spdlog alone
// would turn logging off).
void apply_log_level(const std::string& level);

// The entries of a --ps_hosts-style list: ConfigError for an empty value or
// entry, or a list separated by something else than ',' (`flag` names it).
std::vector<std::string> split_host_list(const std::string& list, const std::string& flag);

}  // namespace ps
