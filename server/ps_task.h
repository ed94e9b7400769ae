// Runs a parameter-server shard inside a trainer started with --job_name=ps
// (TensorFlow's one-program-per-role style), with psd's behaviour: it serves
// until SIGTERM/SIGINT or, by default, until the chief finished the job and
// every worker left. `psd` stays the standalone way to run a shard.
//
//   ps::PsTaskFlags ps_flags;
//   ps::add_ps_task_flags(app, ps_flags);
//   ...
//   if (spec.is_ps()) return ps::run_ps_task(spec.task_index(), spec.num_ps(), spec.self_address(), ps_flags);
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>


namespace ps {

struct PsTaskFlags {
  std::string bind;          // empty: 127.0.0.1 for a loopback address, else 0.0.0.0
  unsigned threads = 0;      // 0: one per core
  bool exit_when_done = true;
  std::string port_file;
  std::string log_level = "info";
  std::optional<int> nice;   // unset: the priority the task was started with
};

// psd's flags that matter for an in-process shard: --bind, --threads,
// --exit_when_done, --port_file, --log_level, --nice.
void add_ps_task_flags(CLI::App& app, PsTaskFlags& flags);

// Sets spdlog's level from --log_level; ConfigError for a name it does not
// know (spdlog alone would turn logging off).
void apply_log_level(const PsTaskFlags& flags);

// Serves shard `task_index` of `num_ps` on `self_address` ("host:port" as a
// ClusterSpec checked it, or "unix:/path"). Returns the exit code (0 after a
// clean stop); throws ConfigError.
int run_ps_task(int task_index, int num_ps, const std::string& self_address, const PsTaskFlags& flags);

}  // namespace ps
