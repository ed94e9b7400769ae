#include "ps/trainer_flags.h"

#include <cmath>
#include <cstdio>

#include <kj/exception.h>

#include "common/for_people.h"
#include "ps/errors.h"

namespace ps {

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    std::size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

void add_trainer_flags(CLI::App& app, TrainerFlags& f) {
  app.add_option("--job_name", f.job_name,
                 "ps, worker (chief: worker 0) or evaluator; empty: from TF_CONFIG or Slurm");
  app.add_option("--task_index", f.task_index, "index of this task within its job")
      ->capture_default_str()
      ->each([&f](const std::string&) { f.task_index_given = true; });
  // expected(0, 1): "--ps_hosts=" counts as given and empty (refused as
  // such), instead of taking the next argument as its value.
  f.ps_hosts_option =
      app.add_option("--ps_hosts", f.ps_hosts, "comma-separated host:port list of the ps tasks")
          ->expected(0, 1);
  f.worker_hosts_option = app.add_option("--worker_hosts", f.worker_hosts,
                                         "comma-separated host:port list of the workers")
                              ->expected(0, 1);
  app.add_option("--slurm_num_ps", f.slurm_num_ps, "under Slurm: the first N tasks are ps")
      ->capture_default_str();
  app.add_option("--port_base", f.port_base, "under Slurm: task ports start here")
      ->capture_default_str();
  app.add_flag("--sync_replicas", f.sync_replicas,
               "synchronous training: average gradients of the replicas per step");
  app.add_option("--replicas_to_aggregate", f.replicas_to_aggregate,
                 "sync: gradients averaged per step (default: all workers; fewer: backup workers)");
  app.add_option(
      "--max_staleness", f.max_staleness,
      "bounded staleness: no worker more than N steps ahead of the slowest (0: plain async)");
  app.add_option("--train_steps", f.train_steps, "global steps to train (0: use --epochs)");
  app.add_option("--epochs", f.epochs,
                 "epochs over the training set, all workers together (when --train_steps is 0)")
      ->capture_default_str();
  app.add_option("--batch_size", f.batch_size, "examples per step and worker")
      ->capture_default_str();
  app.add_option("--learning_rate", f.learning_rate, "learning rate")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd, momentum, nesterov, adam, adagrad, rmsprop")
      ->capture_default_str();
  app.add_option("--lr_schedule", f.lr_schedule,
                 "learning rate over the job: exponential (x --lr_decay per epoch), constant, or "
                 "cosine (down to --lr_alpha x the rate over the planned steps)")
      ->capture_default_str();
  app.add_option("--lr_decay", f.lr_decay,
                 "--lr_schedule exponential: learning rate multiplied by this every epoch")
      ->capture_default_str();
  app.add_option("--lr_alpha", f.lr_alpha,
                 "--lr_schedule cosine: the final learning rate as a fraction of the first")
      ->capture_default_str();
  app.add_option("--data_dir", f.data_dir,
                 "directory with the four IDX files (scripts/get_data.sh)")
      ->capture_default_str();
  app.add_option("--logdir,--log_dir", f.logdir, "TensorBoard event files go here (chief only)");
  app.add_option("--seed", f.seed, "random seed (initialisation, shuffling)")
      ->capture_default_str();
  app.add_option("--num_gpus", f.num_gpus, "GPUs per worker (0: CPU)")->capture_default_str();
  app.add_option("--connect_timeout", f.connect_timeout_s, "seconds to wait for the ps tasks")
      ->capture_default_str();
  app.add_option("--busy_poll_us", f.busy_poll_us,
                 "poll up to this many microseconds for each answer before sleeping (adaptive, off "
                 "while CPUs are oversubscribed; 0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1000000u));
  app.add_option("--shared_memory_mb", f.shared_memory_mb,
                 "memory shared with each psd on this host, MiB: tensors move through it instead "
                 "of the Unix socket (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 20));
  app.add_option("--dead_peer_secs", f.dead_peer_secs,
                 "a ps host silent this long while probed (powered off or cut off: no FIN) is "
                 "taken for gone, and "
                 "reconnected to (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 86400u));
  app.add_option(
      "--auth_token_file", f.auth_token_file,
      "file holding the token of psds started with --auth_token_file (in clear text unless "
      "--tls_ca)");
  app.add_option("--tls_ca", f.tls_ca,
                 "TLS to psds started with --tls_cert: PEM file of the CA(s) that signed their "
                 "certificates");
  app.add_option("--tls_server_name", f.tls_server_name,
                 "TLS: the name psd certificates must carry (default: each ps host's host part)");
  app.add_option("--tls_client_cert", f.tls_client_cert,
                 "TLS: this worker's PEM certificate, for psds started with --tls_client_ca");
  app.add_option("--tls_client_key", f.tls_client_key, "TLS: the PEM key of --tls_client_cert");
  app.add_option("--log_every", f.log_every, "a progress line every N local steps")
      ->capture_default_str();
}

ClusterSpec TrainerFlags::cluster_spec() const {
  for (const CLI::Option* o : {ps_hosts_option, worker_hosts_option}) {
    if (o && o->count() > 0 && (o == ps_hosts_option ? ps_hosts : worker_hosts).empty()) {
      throw ConfigError(o->get_name() + " is empty: give host:port[,host:port...]");
    }
  }
  if (!ps_hosts.empty() || !worker_hosts.empty()) {
    if (ps_hosts.empty()) throw ConfigError("--worker_hosts given without --ps_hosts");
    if (job_name.empty())
      throw ConfigError("--job_name is required with --ps_hosts (ps or worker)");
    // Without --worker_hosts: one worker (workers do not listen; its address
    // is a placeholder).
    return ClusterSpec::from_flags(ps_hosts, worker_hosts.empty() ? "127.0.0.1:1" : worker_hosts,
                                   job_name, task_index);
  }
  const auto env = ClusterSpec::current_environment();
  auto has = [&](const char* k) {
    auto it = env.find(k);
    return it != env.end() && it->second.find_first_not_of(" \t\r\n") != std::string::npos;
  };
  if (!has("TF_CONFIG") && !has("SLURM_PROCID")) {
    throw ConfigError(
        "no cluster: give --ps_hosts, --worker_hosts, --job_name and --task_index, or set "
        "TF_CONFIG, "
        "or run under Slurm");
  }
  ClusterSpec spec = ClusterSpec::from_environment(env, slurm_num_ps, port_base);
  if (!job_name.empty() && job_name != spec.job_name() &&
      !(job_name == "worker" && spec.is_worker())) {
    throw ConfigError("--job_name=" + job_name + " contradicts the environment's task type '" +
                      spec.job_name() + "'");
  }
  if (task_index_given && task_index != spec.task_index()) {
    throw ConfigError("--task_index=" + std::to_string(task_index) +
                      " contradicts the environment's task index " +
                      std::to_string(spec.task_index()));
  }
  return spec;
}

ClientOptions TrainerFlags::client_options(const ClusterSpec& spec) const {
  ClientOptions o;
  o.ps_hosts = spec.ps_hosts();
  o.worker_index = spec.worker_index();
  o.is_chief = spec.is_chief();
  o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s * 1000));
  o.busy_poll = std::chrono::microseconds(busy_poll_us);
  o.shared_memory_bytes = std::size_t{shared_memory_mb} << 20;
  o.dead_peer_timeout = std::chrono::seconds(dead_peer_secs);
  o.auth_token_file = auth_token_file;
  o.tls_ca = tls_ca;
  o.tls_server_name = tls_server_name;
  o.tls_cert = tls_client_cert;
  o.tls_key = tls_client_key;
  if (o.call_timeout.count() > 0 && o.call_timeout < o.connect_timeout)
    o.call_timeout = o.connect_timeout;
  return o;
}

int TrainerFlags::replicas(const ClusterSpec& spec) const {
  return replicas_to_aggregate > 0 ? replicas_to_aggregate : spec.num_workers();
}

JobConfig TrainerFlags::job_config(const ClusterSpec& spec, int64_t steps) const {
  validate();  // every trainer gets here: one that never called validate() ran with --batch_size 0
  if (sync_replicas && replicas_to_aggregate > spec.num_workers()) {
    throw ConfigError("--replicas_to_aggregate=" + std::to_string(replicas_to_aggregate) +
                      " is more than the " + std::to_string(spec.num_workers()) + " workers");
  }
  JobConfig c;
  c.total_replicas = static_cast<uint32_t>(spec.num_workers());
  c.train_steps = steps;
  if (host_list_bytes(spec.worker_hosts(), spec.ps_hosts()) <= kMaxHostListBytes) {
    c.worker_hosts = spec.worker_hosts();  // else too many for psd to keep: no cluster check
    c.ps_hosts = spec.ps_hosts();
  }
  if (sync_replicas) {
    c.mode = SyncMode::kSync;
    c.replicas_to_aggregate = static_cast<uint32_t>(replicas(spec));
  } else if (max_staleness > 0) {
    c.mode = SyncMode::kBoundedStaleness;
    c.max_staleness = static_cast<uint32_t>(max_staleness);
  }
  return c;
}

int64_t TrainerFlags::examples_per_global_step(const ClusterSpec& spec) const {
  return static_cast<int64_t>(batch_size) * (sync_replicas ? replicas(spec) : 1);
}

int64_t TrainerFlags::global_steps(const ClusterSpec& spec, int64_t examples) const {
  if (train_steps > 0) return train_steps;
  return steps_for_epochs(epochs, examples, examples_per_global_step(spec));
}

int64_t steps_for_epochs(double epochs, int64_t examples, int64_t examples_per_step) {
  if (!(epochs > 0)) throw ConfigError("give --train_steps or --epochs (both are 0)");
  // In double first: a cast of NaN, Inf or 1e300 to int64 is undefined (it trained 1 step).
  const double steps =
      std::ceil(epochs * static_cast<double>(examples) / static_cast<double>(examples_per_step));
  if (!(steps <= static_cast<double>(kMaxStep))) {
    throw ConfigError("--epochs " + std::to_string(epochs) +
                      " is more global steps than a job can count (2^62)");
  }
  return std::max<int64_t>(1, static_cast<int64_t>(steps));
}

OptimizerConfig TrainerFlags::optimizer_config(int64_t steps_per_epoch,
                                               int64_t planned_steps) const {
  OptimizerConfig c = OptimizerConfig::from_name(optimizer, learning_rate);
  if (lr_schedule == "cosine") {
    if (planned_steps <= 0) {
      throw ConfigError(
          "--lr_schedule cosine falls over the planned steps, which this trainer does not "
          "give: use --lr_schedule exponential or constant");
    }
    c.schedule = LrSchedule::kCosineDecay;
    c.decay_steps = planned_steps;
    c.alpha = static_cast<float>(lr_alpha);
  } else if (lr_schedule == "exponential" && lr_decay != 1.0 && steps_per_epoch > 0) {
    c.schedule = LrSchedule::kExponentialDecay;
    c.decay_rate = static_cast<float>(lr_decay);
    c.decay_steps = steps_per_epoch;
  }
  return c;
}

void TrainerFlags::validate() const {
  if (batch_size < 1)
    throw ConfigError("--batch_size must be >= 1 (got " + std::to_string(batch_size) + ")");
  if (!(learning_rate > 0) || !std::isfinite(learning_rate))
    throw ConfigError("--learning_rate must be > 0");
  if (train_steps < 0 || train_steps > kMaxStep)
    throw ConfigError("--train_steps must be in 0..2^62");
  if (!(epochs >= 0) || !std::isfinite(epochs))
    throw ConfigError("--epochs must be a finite number >= 0");
  if (replicas_to_aggregate < 0) throw ConfigError("--replicas_to_aggregate must be >= 0");
  if (max_staleness < 0) throw ConfigError("--max_staleness must be >= 0");
  if (sync_replicas && max_staleness > 0)
    throw ConfigError("--sync_replicas and --max_staleness exclude each other");
  if (!(lr_decay > 0 && lr_decay <= 1)) throw ConfigError("--lr_decay must be in (0, 1]");
  if (lr_schedule != "exponential" && lr_schedule != "constant" && lr_schedule != "cosine") {
    throw ConfigError("--lr_schedule '" + lr_schedule +
                      "' is not a schedule: give exponential, constant or cosine");
  }
  if (lr_schedule != "exponential" && lr_decay != 1.0) {
    throw ConfigError("--lr_decay applies to --lr_schedule exponential, not " + lr_schedule +
                      ": give --lr_schedule exponential with it");
  }
  if (!(lr_alpha >= 0 && lr_alpha <= 1)) throw ConfigError("--lr_alpha must be in [0, 1]");
  if (num_gpus < 0) throw ConfigError("--num_gpus must be >= 0");
  if (!(connect_timeout_s > 0)) throw ConfigError("--connect_timeout must be > 0");
  if (log_every < 0) throw ConfigError("--log_every must be >= 0");
  (void)OptimizerConfig::from_name(optimizer, learning_rate);  // throws on an unknown name
}

std::vector<int> parse_positive_ints(const std::string& flag, const std::string& list,
                                     const std::string& example) {
  std::vector<int> out;
  for (const auto& part : split_list(list)) {
    try {
      std::size_t used = 0;
      const int v = std::stoi(part, &used);
      if (used != part.size() || v < 1) throw std::invalid_argument(part);
      out.push_back(v);
    } catch (const std::exception&) {
      throw ConfigError(flag + ": '" + part + "' is not a positive integer (e.g. " + example + ")");
    }
  }
  return out;
}

int run_trainer_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 2;
  } catch (const ConnectionError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, for_people(e.what()).c_str());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  } catch (const kj::Exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, for_people(e.getDescription().cStr()).c_str());
    return 1;
  }
}

}  // namespace ps
