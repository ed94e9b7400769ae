// The standard TensorFlow-style trainer flags, and what a trainer builds from
// them: the cluster (flags, else TF_CONFIG, else Slurm), the Client's options
// and the job's configuration.
//
// Example (a whole worker's set-up):
//   CLI::App app{"my_trainer"};
//   ps::TrainerFlags flags;
//   ps::add_trainer_flags(app, flags);
//   PS_PARSE_FLAGS(app, argc, argv);
//   ps::ClusterSpec spec = flags.cluster_spec();        // throws ConfigError
//   ps::Client client(flags.client_options(spec));      // ConnectionError if no ps
//   ps::TrainingSession session(client, {.job = flags.job_config(spec, steps)});
//
// Flags (TensorFlow's names): --job_name --task_index --ps_hosts
// --worker_hosts --sync_replicas --replicas_to_aggregate --train_steps
// --batch_size --learning_rate --optimizer --lr_schedule --lr_decay --lr_alpha --data_dir --logdir
// (--log_dir)
// --seed --num_gpus; and --max_staleness (bounded staleness), --epochs,
// --slurm_num_ps / --port_base (Slurm), --connect_timeout, --dead_peer_secs,
// --auth_token_file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "ps/flag_parsing.h"  // PS_PARSE_FLAGS, for the flags added here
#include "ps/client.h"
#include "ps/cluster_spec.h"
#include "ps/job.h"
#include "ps/tensor_spec.h"

namespace ps {

struct TrainerFlags {
  // Cluster. All empty: from the environment (TF_CONFIG, then Slurm).
  std::string job_name;
  int task_index = 0;
  bool task_index_given = false;  // on the command line: must match TF_CONFIG's or Slurm's
  std::string ps_hosts;
  std::string worker_hosts;
  int slurm_num_ps = 1;
  // Set by add_trainer_flags: tells a flag given empty ("--ps_hosts=") from one not given.
  const CLI::Option* ps_hosts_option = nullptr;
  const CLI::Option* worker_hosts_option = nullptr;
  int port_base = 2222;

  // Job.
  bool sync_replicas = false;
  int replicas_to_aggregate = 0;  // 0: every worker
  int max_staleness = 0;          // > 0: bounded staleness (async otherwise)
  int64_t train_steps = 0;        // global steps; 0: from --epochs
  double epochs = 0;              // used when train_steps is 0

  // Model and data.
  int batch_size = 100;
  float learning_rate = 0.001f;
  std::string optimizer = "adam";
  // The learning rate over the job, applied on the ps: "exponential" (x lr_decay per epoch;
  // constant at lr_decay 1), "constant", or "cosine" (from learning_rate down to
  // lr_alpha x learning_rate over the planned global steps, as tf's cosine_decay).
  std::string lr_schedule = "exponential";
  double lr_decay = 1.0;  // exponential: learning rate x this per epoch
  double lr_alpha = 0.0;  // cosine: the final learning rate as a fraction of the first
  std::string data_dir = "data/fashion-mnist";
  std::string logdir;  // TensorBoard events (chief); empty: none
  uint64_t seed = 42;
  int num_gpus = 0;

  // Connection.
  double connect_timeout_s = 30;
  unsigned busy_poll_us = 50;  // ClientOptions::busy_poll
  unsigned shared_memory_mb = static_cast<unsigned>(ClientOptions{}.shared_memory_bytes >>
                                                    20);  // ClientOptions::shared_memory_bytes
  unsigned dead_peer_secs = 30;                           // ClientOptions::dead_peer_timeout
  std::string auth_token_file;  // ClientOptions::auth_token_file (psd --auth_token_file)
  // TLS to psds started with --tls_cert (ClientOptions::tls_*).
  std::string tls_ca;           // ClientOptions::tls_ca
  std::string tls_server_name;  // ClientOptions::tls_server_name
  std::string tls_client_cert;  // ClientOptions::tls_cert (psd --tls_client_ca)
  std::string tls_client_key;   // ClientOptions::tls_key

  // Logging.
  int log_every = 100;  // a progress line every N local steps

  // The cluster: from the flags when --ps_hosts or --worker_hosts is given,
  // else from TF_CONFIG / Slurm. Throws ConfigError with a one-line message.
  ClusterSpec cluster_spec() const;
  // Client options for a worker of `spec` (ps hosts, worker index, chief).
  ClientOptions client_options(const ClusterSpec& spec) const;
  // Replicas aggregated per sync step: --replicas_to_aggregate or all workers.
  int replicas(const ClusterSpec& spec) const;
  // The job: async, sync (--sync_replicas) or bounded staleness
  // (--max_staleness > 0), stopping at `train_steps` global steps. Checks the
  // flags first (validate(), and --replicas_to_aggregate against the
  // workers): throws ConfigError.
  JobConfig job_config(const ClusterSpec& spec, int64_t train_steps) const;
  // Global steps for --train_steps, or --epochs over `examples` training
  // examples (a sync step consumes replicas x batch examples, an async step
  // one batch). Throws ConfigError when neither is set.
  int64_t global_steps(const ClusterSpec& spec, int64_t examples) const;
  // Examples consumed by one global step.
  int64_t examples_per_global_step(const ClusterSpec& spec) const;
  // The optimizer named by --optimizer at --learning_rate with the schedule of
  // --lr_schedule: exponential decays by --lr_decay every `steps_per_epoch`
  // updates (when both are set); cosine falls over `planned_steps` global steps
  // (ConfigError when it is 0).
  OptimizerConfig optimizer_config(int64_t steps_per_epoch = 0, int64_t planned_steps = 0) const;
  // Checks ranges (batch size, learning rate, ...); throws ConfigError.
  void validate() const;
};

// Global steps for `epochs` passes over `examples` examples, `examples_per_step`
// a step (at least 1). Throws ConfigError for epochs that are not > 0, or
// so many that the step count passes kMaxStep.
int64_t steps_for_epochs(double epochs, int64_t examples, int64_t examples_per_step);

// Registers the flags on `app`; values land in `flags`.
void add_trainer_flags(CLI::App& app, TrainerFlags& flags);

// Splits "a,b,c" (empty parts dropped).
std::vector<std::string> split_list(const std::string& s, char sep = ',');

// A list of positive integers such as layer sizes ("100", "512,512"), given
// as `flag`. Throws ConfigError naming the flag, the bad part and `example`:
//   parse_positive_ints("--hidden_units", "512,x", "256,128")
//     -> "--hidden_units: 'x' is not a positive integer (e.g. 256,128)"
std::vector<int> parse_positive_ints(const std::string& flag, const std::string& list,
                                     const std::string& example);

// Runs a trainer's body and turns what it throws into one line on stderr
// ("<program>: error: ...") and an exit code: 2 for a bad configuration
// (ConfigError), 3 for an unreachable ps (ConnectionError), 1 otherwise.
//   return ps::run_trainer_main("my_trainer", [&] { ...; return 0; });
int run_trainer_main(const char* program, const std::function<int()>& body);

}  // namespace ps
