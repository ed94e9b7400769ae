#include "server/psd_flags.h"

#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/auth_token.h"
#include "common/memory_budget.h"
#include "common/net/host_port.h"
#include "ps/cluster_spec.h"
#include "server/process_priority.h"
#include "server/psd_environment.h"
#include "ps/errors.h"

namespace ps {

namespace {

constexpr int kMaxSizeMb = 1 << 24;
constexpr unsigned kMaxThreads = 1024;
constexpr int kMaxCheckpointSecs = 366 * 86400;
// Below these a limit or period stops making sense: a message or stored part
// under 1 KiB holds almost nothing, and a period under 10 ms turns the
// checkpoint timer into a busy loop.
constexpr double kMinSizeMb = 1.0 / 1024;
constexpr double kMinCheckpointSecs = 0.01;

// Registers `name` unless a trainer already has it (kTrainer): then the
// trainer's option stays the only one, and its value, where given, is taken.
template <class T>
CLI::Option* add_or_share(CLI::App& app, PsdFlagValues& x, const std::string& name, T& var,
                          const std::string& help) {
  if (x.door == PsdFrontDoor::kTrainer) {
    if (CLI::Option* theirs = app.get_option_no_throw(name)) {
      x.take_shared.push_back([theirs, &var] {
        if (theirs->count() > 0) var = theirs->as<T>();
      });
      return nullptr;
    }
  }
  return app.add_option(name, var, help);
}

// Checkpoints, authentication and per-client limits.
void add_durability_flags(CLI::App& app, ServerOptions& o, PsdFlagValues& x) {
  app.add_option(
      "--checkpoint_dir", o.checkpoint.dir,
      "write checkpoints to DIR/shard-<i>-of-<n>/ and restore the newest valid one at start");
  app.add_option("--checkpoint_secs", o.checkpoint.every_secs,
                 "checkpoint every this many seconds when something changed (0: only on SIGTERM "
                 "and on request)")
      ->capture_default_str();
  app.add_option("--keep_checkpoints", o.checkpoint.keep, "checkpoint files kept per shard")
      ->capture_default_str();
  add_or_share(app, x, "--auth_token_file", x.auth_token_file,
               "require clients to present the token in this file (in clear text on the wire: use "
               "on trusted "
               "networks)");
  app.add_option("--http_auth_token_file", x.http_auth_token_file,
                 "HTTP: require \"Authorization: Bearer <token>\" with the token in this file on "
                 "every path but "
                 "/healthz (default: --auth_token_file's token, when given)");
  app.add_option("--tls_cert", o.tls.cert,
                 "TLS on the TCP and HTTP ports: this PEM certificate (chain), with --tls_key; "
                 "clients need --tls_ca (docs/operations.md, Security)");
  app.add_option("--tls_key", o.tls.key, "TLS: the PEM private key of --tls_cert");
  app.add_option("--tls_client_ca", o.tls.client_ca,
                 "TLS: require client certificates signed by a CA in this PEM file");
  app.add_option("--max_tensors_per_client", o.shard.max_tensors_per_client,
                 "tensors one connection may create (0: no limit)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& v) {
            return v.find('-') == std::string::npos ? std::string() : "must be >= 0";
          },
          "NONNEGATIVE"));
  app.add_option("--worker_timeout_secs", o.shard.worker_timeout_secs,
                 "sync mode: stop waiting for a worker silent this long, connected or one that "
                 "never connected (0: wait for it)")
      ->capture_default_str();
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The shard's index, count and listening address from its place in the cluster.
void apply_place(ServerOptions& o, const PsdFlagValues& x, const PsdPlace& place) {
  const std::string& me = place.address;
  if (me.rfind("unix:", 0) == 0) {
    o.unix_socket = me.substr(5);
    o.port = 0;
  } else {
    const auto parts = split_host_port(me);
    if (!parts || parts->port.empty())
      throw ConfigError("ps host '" + me + "' has no port (expected host:port)");
    try {
      std::size_t used = 0;
      o.port = std::stoi(parts->port, &used);
      if (used != parts->port.size()) throw std::invalid_argument(parts->port);
    } catch (const std::exception&) {
      throw ConfigError("ps host '" + me + "' has a bad port '" + parts->port + "'");
    }
    if (!x.bind_given) o.bind = is_loopback_host(parts->host) ? "127.0.0.1" : "0.0.0.0";
  }
  o.shard.shard_index = static_cast<uint32_t>(place.task_index);
  o.shard.num_shards = static_cast<uint32_t>(place.num_ps);
  o.listen_from = "ps task " + std::to_string(place.task_index) + "'s entry '" + me +
                  "' in the cluster's ps hosts (--ps_hosts, TF_CONFIG or Slurm; "
                  "scripts/launch_local.sh: --port_base)";
}

}  // namespace

std::vector<std::string> split_host_list(const std::string& list, const std::string& flag) {
  if (list.find_first_not_of(" \t") == std::string::npos) {
    throw ConfigError(flag + " is empty: give host:port[,host:port...]");
  }
  for (char sep : {';', ' ', '\t'}) {
    if (list.find(sep) != std::string::npos) {
      throw ConfigError(flag + "='" + list +
                        "': separate hosts with ',' (e.g. 10.0.0.1:2222,10.0.0.2:2222)");
    }
  }
  std::vector<std::string> hosts;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    hosts.push_back(list.substr(start, comma - start));
    if (hosts.back().empty())
      throw ConfigError(flag + "='" + list + "' has an empty entry (two commas, or one at an end)");
    start = comma + 1;
  }
  return hosts;
}

void apply_log_level(const std::string& name) {
  const auto level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") {
    throw ConfigError("unknown --log_level '" + name + "' (trace, debug, info, warn, error, off)");
  }
  spdlog::set_level(level);
}

void add_psd_flags(CLI::App& app, ServerOptions& o, PsdFlagValues& x, PsdFrontDoor door) {
  x.door = door;
  if (door == PsdFrontDoor::kPsd) {
    x.place_options.push_back(
        app.add_option("--port", o.port, "TCP port to listen on (0: any free port)")
            ->capture_default_str());
    app.add_option("--unix_socket", o.unix_socket,
                   "also listen on this Unix-domain socket (fast path on one host)");
    x.place_options.push_back(
        app.add_option("--shard_index", o.shard.shard_index, "this shard's index")
            ->capture_default_str());
    x.place_options.push_back(
        app.add_option("--num_shards", o.shard.num_shards, "number of shards in the job")
            ->capture_default_str());
    // expected(0, 1): "--ps_hosts=" is given and empty, not a taker of the next argument.
    x.ps_hosts_option =
        app.add_option("--ps_hosts", x.ps_hosts,
                       "comma-separated ps host:port list; with --task_index sets shard and port")
            ->expected(0, 1);
    x.place_options.push_back(x.ps_hosts_option);
    x.place_options.push_back(
        app.add_option("--task_index", x.task_index, "this ps task's index in --ps_hosts"));
    // Without the flags above psd reads TF_CONFIG, then Slurm, as the trainers do.
    app.add_option("--slurm_num_ps", x.slurm_num_ps,
                   "under Slurm (no --ps_hosts/--port): the first N tasks are ps")
        ->capture_default_str();
    app.add_option("--port_base", x.port_base, "under Slurm: task ports start here")
        ->capture_default_str();
  }
  app.add_option("--bind", o.bind,
                 "address to listen on (default: 127.0.0.1, or 0.0.0.0 for a shard whose "
                 "--ps_hosts entry names "
                 "another host)")
      ->each([&x](const std::string&) { x.bind_given = true; });
  app.add_option("--port_file", o.port_file, "write the bound port to this file once listening");
  app.add_option(
         "--http_port", x.http_port,
         "serve /metrics (Prometheus), /healthz and a status page over HTTP on this port of --bind "
         "(0: off; any: a free port, see --http_port_file)")
      ->capture_default_str();
  app.add_option("--http_port_file", o.http_port_file,
                 "write the bound HTTP port to this file once listening");
  o.threads = std::max(1u, std::thread::hardware_concurrency());
  app.add_option("--threads", o.threads,
                 "psd: compute threads applying updates (0: on the network thread)")
      ->capture_default_str();
  // Half the cores: a psd host usually runs workers or other shards too.
  o.shard.table_threads = std::max(1u, std::thread::hardware_concurrency() / 2);
  app.add_option("--table_threads", o.shard.table_threads,
                 "psd: threads one large embedding-table pull or push is spread over, the "
                 "network thread's included (1: that thread alone)")
      ->capture_default_str();
  if (CLI::Option* opt =
          add_or_share(app, x, "--log_level", x.log_level, "trace, debug, info, warn, error")) {
    opt->capture_default_str();
  }
  app.add_option("--max_message_mb", x.max_message_mb, "largest request accepted, MiB")
      ->capture_default_str();
  app.add_option("--max_tensor_mb", x.max_tensor_mb, "largest tensor (or part) accepted, MiB")
      ->capture_default_str();
  app.add_option("--max_memory_mb", x.max_memory_mb,
                 "memory budget of this psd, MiB: stored tensors with their optimizer slots, "
                 "requests being received "
                 "or held, queued replies and checkpoint snapshots count against it; what would "
                 "pass it is refused "
                 "(0: 3/4 of this machine's memory)")
      ->capture_default_str();
  app.add_option("--max_connections", o.max_connections, "connections served at once")
      ->capture_default_str();
  app.add_option("--max_connections_per_peer", o.max_connections_per_peer,
                 "connections from one address served at once that are not (yet) a worker's or the "
                 "chief's: before "
                 "hello, or anonymous (0: no cap)")
      ->capture_default_str();
  app.add_option("--hello_timeout_secs", x.hello_timeout_secs,
                 "close a connection that has not said hello this long after it was accepted")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--request_timeout_secs", x.request_timeout_secs,
                 "close a connection whose request larger than 128 KiB has not arrived within this "
                 "many seconds plus "
                 "one per MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--max_shared_memory_mb", x.max_shared_memory_mb,
                 "largest shared memory region a client on this host may give psd per connection, "
                 "MiB; tensor values "
                 "then skip the Unix socket (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  if (CLI::Option* opt = add_or_share(
          app, x, "--busy_poll_us", o.busy_poll_us,
          "after its last work, poll the sockets up to this many microseconds before "
          "sleeping: lower latency for small tensors, at the price of CPU; adaptive (0: "
          "sleep at once)")) {
    opt->capture_default_str()->check(CLI::Range(0u, 1000000u));
  }
  app.add_option("--nice", x.nice,
                 "scheduling priority of psd's threads, as nice(1) (-20..19): below 0 keeps "
                 "workers on this host "
                 "from preempting psd (needs root or CAP_SYS_NICE); unset: as started");
  if (CLI::Option* opt = add_or_share(
          app, x, "--dead_peer_secs", o.dead_peer_secs,
          "a TCP peer silent this long while probed (a host powered off or cut off, which "
          "sends no FIN) is taken for gone, as if its connection closed (0: never)")) {
    opt->capture_default_str()->check(CLI::Range(0u, 86400u));
  }
  app.add_flag("--allow_nonfinite", o.shard.allow_nonfinite,
               "accept gradients containing NaN or Inf, and updates that make NaN or Inf "
               "(docs/hardening.md)");
  add_durability_flags(app, o, x);
  app.add_option("--exit_when_done", o.exit_when_done,
                 "exit once the chief reports the job finished and every worker has disconnected")
      ->capture_default_str();
}

void finish_psd_flags(ServerOptions& o, PsdFlagValues& x, const std::optional<PsdPlace>& place) {
  for (const auto& take : x.take_shared) take();
  apply_log_level(x.log_level);

  std::optional<PsdPlace> from_env;
  if (!place && x.door == PsdFrontDoor::kPsd) {
    std::string given;
    for (const CLI::Option* opt : x.place_options)
      if (given.empty() && opt->count() > 0) given = opt->get_name();
    from_env = psd_place_from_environment(ClusterSpec::current_environment(), x.slurm_num_ps,
                                          x.port_base, given);
  }
  if (place) {
    apply_place(o, x, *place);
  } else if (from_env) {
    apply_place(o, x, *from_env);
  } else if ((x.ps_hosts_option && x.ps_hosts_option->count() > 0) || !x.ps_hosts.empty() ||
             x.task_index >= 0) {
    const std::vector<std::string> hosts = split_host_list(x.ps_hosts, "--ps_hosts");
    if (x.task_index < 0 || x.task_index >= static_cast<int>(hosts.size())) {
      throw ConfigError("--task_index " + std::to_string(x.task_index) +
                        " is outside --ps_hosts (" + std::to_string(hosts.size()) +
                        " hosts: give --task_index 0.." + std::to_string(hosts.size() - 1) + ")");
    }
    apply_place(o, x,
                PsdPlace{.task_index = x.task_index,
                         .num_ps = static_cast<int>(hosts.size()),
                         .address = hosts[x.task_index]});
  }
  if (o.shard.num_shards < 1 || o.shard.shard_index >= o.shard.num_shards) {
    throw ConfigError("--shard_index " + std::to_string(o.shard.shard_index) +
                      " must be below --num_shards " + std::to_string(o.shard.num_shards));
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
    if (p < 0 || p > 65535)
      throw ConfigError("--http_port must be a port (1..65535), 0 (off) or 'any', not '" +
                        x.http_port + "'");
    if (p > 0) o.http_port = static_cast<uint16_t>(p);
  }
  if (!o.http_port_file.empty() && !o.http_port)
    throw ConfigError("--http_port_file needs --http_port");
  // NaN fails every comparison: each check is written to pass only good values.
  if (!(x.max_message_mb >= kMinSizeMb && x.max_message_mb <= kMaxSizeMb))
    throw ConfigError(fmt::format("--max_message_mb must be in {}..{} (1 KiB to 16 TiB), not {}",
                                  kMinSizeMb, kMaxSizeMb, x.max_message_mb));
  if (!(x.max_tensor_mb >= kMinSizeMb && x.max_tensor_mb <= kMaxSizeMb))
    throw ConfigError(fmt::format("--max_tensor_mb must be in {}..{} (1 KiB to 16 TiB), not {}",
                                  kMinSizeMb, kMaxSizeMb, x.max_tensor_mb));
  const uint64_t machine = MemoryBudget::machine_bytes();
  const double machine_mb = static_cast<double>(machine > 0 ? machine >> 20 : kMaxSizeMb);
  if (!(x.max_memory_mb >= 0 && x.max_memory_mb <= machine_mb))
    throw ConfigError(fmt::format(
        "--max_memory_mb must be in 0..{} (this machine's memory; 0: 3/4 of it), not {}",
        machine_mb, x.max_memory_mb));
  if (!(x.hello_timeout_secs >= 0.1 && x.hello_timeout_secs <= 3600))
    throw ConfigError("--hello_timeout_secs must be in 0.1..3600");
  if (!(x.request_timeout_secs >= 0.1 && x.request_timeout_secs <= 86400))
    throw ConfigError("--request_timeout_secs must be in 0.1..86400");
  if (o.threads > kMaxThreads)
    throw ConfigError("--threads must be in 0.." + std::to_string(kMaxThreads));
  if (o.shard.table_threads < 1 || o.shard.table_threads > kMaxThreads + 1)
    throw ConfigError("--table_threads must be in 1.." + std::to_string(kMaxThreads + 1));
  if (o.max_connections < 1) throw ConfigError("--max_connections must be >= 1");
  o.shard.max_message_bytes = static_cast<uint64_t>(x.max_message_mb * (1 << 20));
  o.shard.limits.max_tensor_bytes = static_cast<uint64_t>(x.max_tensor_mb * (1 << 20));
  o.max_memory_bytes = static_cast<uint64_t>(x.max_memory_mb * (1 << 20));
  o.hello_deadline_ms = static_cast<unsigned>(x.hello_timeout_secs * 1000);
  o.request_timeout_ms = static_cast<unsigned>(x.request_timeout_secs * 1000);
  o.shard.max_shared_memory_bytes = static_cast<uint64_t>(x.max_shared_memory_mb) << 20;
  if (!x.auth_token_file.empty()) o.shard.auth_token = read_auth_token(x.auth_token_file);
  if (!x.http_auth_token_file.empty()) o.http_auth_token = read_auth_token(x.http_auth_token_file);
  if (!(o.checkpoint.every_secs == 0 || (o.checkpoint.every_secs >= kMinCheckpointSecs &&
                                         o.checkpoint.every_secs <= kMaxCheckpointSecs)))
    throw ConfigError(fmt::format(
        "--checkpoint_secs must be 0 (only on SIGTERM and on request) or in {}..{}, not {}",
        kMinCheckpointSecs, kMaxCheckpointSecs, o.checkpoint.every_secs));
  if (o.checkpoint.keep < 1) throw ConfigError("--keep_checkpoints must be >= 1");
  if (o.checkpoint.every_secs > 0 && o.checkpoint.dir.empty())
    throw ConfigError("--checkpoint_secs needs --checkpoint_dir");
  // Last, once every other flag is known good; before psd starts its threads.
  if (x.nice) {
    set_process_nice(*x.nice);
    spdlog::info("psd threads at nice {}", *x.nice);
  }
}

}  // namespace ps
