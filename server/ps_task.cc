#include "server/ps_task.h"


#include <spdlog/spdlog.h>

#include "common/net/host_port.h"
#include "server/process_priority.h"
#include "ps/errors.h"
#include "server/server.h"

namespace ps {

void add_ps_task_flags(CLI::App& app, PsTaskFlags& f) {
  app.add_option("--bind", f.bind, "ps task: address to listen on (default: 127.0.0.1 for a loopback host, else 0.0.0.0)");
  app.add_option("--threads", f.threads, "ps task: compute threads applying updates (0: one per core)");
  app.add_option("--exit_when_done", f.exit_when_done,
                 "ps task: exit once the chief finished the job and every worker left")
      ->capture_default_str();
  app.add_option("--port_file", f.port_file, "ps task: write the bound port here once listening");
  app.add_option("--log_level", f.log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_option("--nice", f.nice,
                 "ps task: scheduling priority of its threads, as psd --nice (-20..19; below 0 needs root or "
                 "CAP_SYS_NICE); unset: as started");
}

void apply_log_level(const PsTaskFlags& f) {
  const auto level = spdlog::level::from_str(f.log_level);
  if (level == spdlog::level::off && f.log_level != "off") throw ConfigError("unknown --log_level '" + f.log_level + "'");
  spdlog::set_level(level);
}

int run_ps_task(int task_index, int num_ps, const std::string& me, const PsTaskFlags& f) {
  ServerOptions o;
  o.shard.shard_index = static_cast<uint32_t>(task_index);
  o.shard.num_shards = static_cast<uint32_t>(num_ps);
  o.threads = f.threads ? f.threads : std::max(1u, std::thread::hardware_concurrency());
  o.exit_when_done = f.exit_when_done;
  o.port_file = f.port_file;
  if (me.rfind("unix:", 0) == 0) {
    o.unix_socket = me.substr(5);
    o.port = 0;
  } else {
    const std::optional<HostPort> split = split_host_port(me);
    if (!split) throw ConfigError("ps task address '" + me + "' is not host:port");
    const HostPort& parts = *split;
    const std::string& host = parts.host;
    o.port = std::stoi(parts.port);
    if (!f.bind.empty()) {
      o.bind = f.bind;
    } else {
      o.bind = (host == "127.0.0.1" || host == "localhost") ? "127.0.0.1" : "0.0.0.0";
    }
  }
  if (f.nice) set_process_nice(*f.nice);  // before serve_until_signal starts the shard's threads
  spdlog::info("ps task {} of {}: serving shard {} on {} (bind {}{})", task_index, num_ps,
               o.shard.shard_index, me, o.bind, f.nice ? ", nice " + std::to_string(*f.nice) : std::string());
  serve_until_signal(o);
  spdlog::info("ps task {} exited cleanly", task_index);
  return 0;
}

}  // namespace ps
