#include "server/psd_flags.h"

#include <thread>

#include <spdlog/spdlog.h>

#include "common/auth_token.h"
#include "common/net/host_port.h"
#include "server/process_priority.h"
#include "ps/errors.h"

namespace ps {

namespace {

// Checkpoints, authentication and per-client limits.
void add_durability_flags(CLI::App& app, ServerOptions& o, PsdFlagValues& x) {
  app.add_option("--checkpoint_dir", o.checkpoint.dir,
                 "write checkpoints to DIR/shard-<i>-of-<n>/ and restore the newest valid one at start");
  app.add_option("--checkpoint_secs", o.checkpoint.every_secs,
                 "checkpoint every this many seconds when something changed (0: only on SIGTERM and on request)")
      ->capture_default_str();
  app.add_option("--keep_checkpoints", o.checkpoint.keep, "checkpoint files kept per shard")->capture_default_str();
  app.add_option("--auth_token_file", x.auth_token_file,
                 "require clients to present the token in this file (in clear text on the wire: use on trusted networks)");
  app.add_option("--http_auth_token_file", x.http_auth_token_file,
                 "HTTP: require \"Authorization: Bearer <token>\" with the token in this file on every path but "
                 "/healthz (default: --auth_token_file's token, when given)");
  app.add_option("--max_tensors_per_client", o.shard.max_tensors_per_client,
                 "tensors one connection may create (0: no limit)")->capture_default_str();
  app.add_option("--worker_timeout_secs", o.shard.worker_timeout_secs,
                 "sync mode: stop waiting for a connected worker silent this long (0: wait while it is connected)")
      ->capture_default_str();
}

}  // namespace

void add_psd_flags(CLI::App& app, ServerOptions& o, PsdFlagValues& x) {
  app.add_option("--port", o.port, "TCP port to listen on (0: any free port)")->capture_default_str();
  app.add_option("--bind", o.bind, "address to listen on; use 0.0.0.0 to accept other hosts")->capture_default_str();
  app.add_option("--unix_socket", o.unix_socket, "also listen on this Unix-domain socket (fast path on one host)");
  app.add_option("--port_file", o.port_file, "write the bound port to this file once listening");
  app.add_option("--http_port", x.http_port,
                 "serve /metrics (Prometheus), /healthz and a status page over HTTP on this port of --bind "
                 "(0: off; any: a free port, see --http_port_file)")
      ->capture_default_str();
  app.add_option("--http_port_file", o.http_port_file, "write the bound HTTP port to this file once listening");
  app.add_option("--shard_index", o.shard.shard_index, "this shard's index")->capture_default_str();
  app.add_option("--num_shards", o.shard.num_shards, "number of shards in the job")->capture_default_str();
  app.add_option("--ps_hosts", x.ps_hosts, "comma-separated ps host:port list; with --task_index sets shard and port");
  app.add_option("--task_index", x.task_index, "this ps task's index in --ps_hosts");
  o.threads = std::max(1u, std::thread::hardware_concurrency());
  app.add_option("--threads", o.threads, "compute threads applying updates (0: on the network thread)")
      ->capture_default_str();
  app.add_option("--log_level", x.log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.add_option("--max_message_mb", x.max_message_mb, "largest request accepted, MiB")->capture_default_str();
  app.add_option("--max_tensor_mb", x.max_tensor_mb, "largest tensor (or part) accepted, MiB")->capture_default_str();
  app.add_option("--max_memory_mb", x.max_memory_mb,
                 "memory budget of this psd, MiB: stored tensors with their optimizer slots, requests being received "
                 "or held, queued replies and checkpoint snapshots count against it; what would pass it is refused "
                 "(0: 3/4 of this machine's memory)")
      ->capture_default_str();
  app.add_option("--max_connections", o.max_connections, "connections served at once")->capture_default_str();
  app.add_option("--max_connections_per_peer", o.max_connections_per_peer,
                 "connections from one address served at once that are not (yet) a worker's or the chief's: before "
                 "hello, or anonymous (0: no cap)")
      ->capture_default_str();
  app.add_option("--hello_timeout_secs", x.hello_timeout_secs,
                 "close a connection that has not said hello this long after it was accepted")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--request_timeout_secs", x.request_timeout_secs,
                 "close a connection whose request larger than 128 KiB has not arrived within this many seconds plus "
                 "one per MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--max_shared_memory_mb", x.max_shared_memory_mb,
                 "largest shared memory region a client on this host may give psd per connection, MiB; tensor values "
                 "then skip the Unix socket (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--busy_poll_us", o.busy_poll_us,
                 "after its last work, poll the sockets up to this many microseconds before sleeping: lower latency "
                 "for small tensors, at the price of CPU; adaptive (0: sleep at once)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1000000u));
  app.add_option("--nice", x.nice,
                 "scheduling priority of psd's threads, as nice(1) (-20..19): below 0 keeps workers on this host "
                 "from preempting psd (needs root or CAP_SYS_NICE); unset: as started");
  app.add_option("--dead_peer_secs", o.dead_peer_secs,
                 "a TCP peer silent this long while probed (a host powered off or cut off, which sends no FIN) is "
                 "taken for gone, as if its connection closed (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 86400u));
  app.add_flag("--allow_nonfinite", o.shard.allow_nonfinite,
               "accept gradients containing NaN or Inf, and updates that make NaN or Inf (docs/hardening.md)");
  add_durability_flags(app, o, x);
  app.add_option("--exit_when_done", o.exit_when_done,
                 "exit once the chief reports the job finished and every worker has disconnected")
      ->capture_default_str();
}

void finish_psd_flags(ServerOptions& o, const PsdFlagValues& x) {
  auto level = spdlog::level::from_str(x.log_level);
  if (level == spdlog::level::off && x.log_level != "off") throw ConfigError("unknown --log_level '" + x.log_level + "'");
  spdlog::set_level(level);

  if (!x.ps_hosts.empty()) {
    std::vector<std::string> hosts;
    std::size_t start = 0;
    while (start <= x.ps_hosts.size()) {
      std::size_t comma = x.ps_hosts.find(',', start);
      if (comma == std::string::npos) comma = x.ps_hosts.size();
      hosts.push_back(x.ps_hosts.substr(start, comma - start));
      start = comma + 1;
    }
    if (x.task_index < 0 || x.task_index >= static_cast<int>(hosts.size())) {
      throw ConfigError("--task_index " + std::to_string(x.task_index) + " is outside --ps_hosts (" +
                        std::to_string(hosts.size()) + " hosts)");
    }
    const std::string& me = hosts[x.task_index];
    if (me.rfind("unix:", 0) == 0) {
      o.unix_socket = me.substr(5);
    } else {
      const auto parts = split_host_port(me);
      if (!parts) throw ConfigError("ps host '" + me + "' has no port (expected host:port)");
      try {
        o.port = std::stoi(parts->port);
      } catch (...) {
        throw ConfigError("ps host '" + me + "' has a bad port");
      }
    }
    o.shard.shard_index = static_cast<uint32_t>(x.task_index);
    o.shard.num_shards = static_cast<uint32_t>(hosts.size());
  }
  if (o.shard.num_shards < 1 || o.shard.shard_index >= o.shard.num_shards) {
    throw ConfigError("--shard_index " + std::to_string(o.shard.shard_index) + " must be below --num_shards " +
                      std::to_string(o.shard.num_shards));
  }
  if (o.port < 0 || o.port > 65535) throw ConfigError("--port must be in 0..65535");
  // --port 0 means "any port", but --http_port 0 means "no HTTP" (monitoring
  // is opt-in), so "any port" has its own spelling.
  if (x.http_port == "any") {
    o.http_port = 0;
  } else {
    int p = -1;
    try {
      std::size_t used = 0;
      p = std::stoi(x.http_port, &used);
      if (used != x.http_port.size()) p = -1;
    } catch (...) {
    }
    if (p < 0 || p > 65535) throw ConfigError("--http_port must be a port (1..65535), 0 (off) or 'any', not '" + x.http_port + "'");
    if (p > 0) o.http_port = static_cast<uint16_t>(p);
  }
  if (!o.http_port_file.empty() && !o.http_port) throw ConfigError("--http_port_file needs --http_port");
  if (x.max_message_mb <= 0 || x.max_tensor_mb <= 0) throw ConfigError("size limits must be > 0");
  if (x.max_memory_mb < 0) throw ConfigError("--max_memory_mb must be >= 0 (0: 3/4 of this machine's memory)");
  o.shard.max_message_bytes = static_cast<uint64_t>(x.max_message_mb * (1 << 20));
  o.shard.limits.max_tensor_bytes = static_cast<uint64_t>(x.max_tensor_mb * (1 << 20));
  o.max_memory_bytes = static_cast<uint64_t>(x.max_memory_mb * (1 << 20));
  o.hello_deadline_ms = static_cast<unsigned>(x.hello_timeout_secs * 1000);
  o.request_timeout_ms = static_cast<unsigned>(x.request_timeout_secs * 1000);
  o.shard.max_shared_memory_bytes = static_cast<uint64_t>(x.max_shared_memory_mb) << 20;
  if (!x.auth_token_file.empty()) o.shard.auth_token = read_auth_token(x.auth_token_file);
  if (!x.http_auth_token_file.empty()) o.http_auth_token = read_auth_token(x.http_auth_token_file);
  if (o.checkpoint.every_secs < 0) throw ConfigError("--checkpoint_secs must be >= 0");
  if (o.checkpoint.keep < 1) throw ConfigError("--keep_checkpoints must be >= 1");
  if (o.checkpoint.every_secs > 0 && o.checkpoint.dir.empty()) throw ConfigError("--checkpoint_secs needs --checkpoint_dir");
  // Last, once every other flag is known good; before psd starts its threads.
  if (x.nice) {
    set_process_nice(*x.nice);
    spdlog::info("psd threads at nice {}", *x.nice);
  }
}

}  // namespace ps
