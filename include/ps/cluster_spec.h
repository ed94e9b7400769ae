// ClusterSpec: who is in the job and which task this process is.
//
// One value type, filled from whichever source the launcher provides:
//   * TensorFlow-style flags (--ps_hosts --worker_hosts --job_name --task_index),
//   * TF_CONFIG as TensorFlow and Kubeflow's TFJob set it,
//   * Slurm's SLURM_* variables (srun, one task per GPU).
//
// Usage:
//   auto spec = ps::ClusterSpec::from_flags("ps0:2222,ps1:2222",
//                                           "w0:2222,w1:2222", "worker", 1);
//   spdlog::info("cluster: {}", spec.to_string());
//   for (auto& shard : spec.ps_hosts()) connect(shard);
//   if (spec.is_chief()) initialize_variables();
//
// Worker numbering: worker_hosts() is the combined list of every training
// replica, the chief first. With flags or Slurm there is no separate chief:
// worker 0 is the chief. With a TF_CONFIG that lists a "chief" (or the older
// "master") job, that task is worker 0 of the combined list and the "worker"
// entries follow, so TF_CONFIG task {"type":"worker","index":i} has
// worker_index() == i + 1, while task_index() stays i as TensorFlow numbers it.
//
// Every bad input throws ps::ConfigError with a one-line message.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ps {

class ClusterSpec {
 public:
  // Flags as in TensorFlow's distributed examples. Host lists are
  // comma-separated "host:port" (port 1..65535, "[v6addr]:port" allowed);
  // ps entries may also be "unix:/path" for the Unix-domain-socket fast path.
  // job_name: "ps", "worker", or "chief" (an alias of worker 0: task_index
  // must then be 0).
  static ClusterSpec from_flags(std::string_view ps_hosts, std::string_view worker_hosts,
                                std::string_view job_name, int task_index);

  // TF_CONFIG JSON: {"cluster":{"chief":[..],"worker":[..],"ps":[..]},
  //                  "task":{"type":"worker","index":1}}
  // Task types: chief, master (old alias of chief), worker, ps, evaluator.
  // The evaluator is outside the training cluster (Kubeflow leaves it out of
  // "cluster"); it gets worker_index() == -1. Unknown keys are ignored.
  static ClusterSpec from_tf_config(std::string_view json);

  // Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST (or
  // SLURM_NODELIST) and SLURM_TASKS_PER_NODE (or SLURM_STEP_TASKS_PER_NODE).
  // Tasks are placed on nodes in block order (Slurm's default distribution);
  // task t listens on port_base + (its local rank on its node). Tasks
  // 0..num_ps-1 are ps, the rest workers (worker 0 is chief).
  // local_gpu() is SLURM_LOCALID. Where SLURMD_NODENAME is set (srun sets
  // it), the node the layout gives this task must be that one.
  static ClusterSpec from_slurm(const std::map<std::string, std::string>& env, int num_ps,
                                int port_base);

  // TF_CONFIG if set (and non-empty), else Slurm if SLURM_PROCID is set, else
  // throws ps::ConfigError. num_ps and port_base are used for Slurm only.
  static ClusterSpec from_environment(const std::map<std::string, std::string>& env, int num_ps = 1,
                                      int port_base = 2222);
  // Same, reading this process's environment.
  static ClusterSpec from_environment(int num_ps = 1, int port_base = 2222);
  // This process's environment as a map.
  static std::map<std::string, std::string> current_environment();

  const std::vector<std::string>& ps_hosts() const { return ps_hosts_; }
  // Combined list of training workers, chief first.
  const std::vector<std::string>& worker_hosts() const { return worker_hosts_; }
  // Evaluator addresses if TF_CONFIG listed any (usually empty).
  const std::vector<std::string>& evaluator_hosts() const { return evaluator_hosts_; }
  // "ps", "worker", "chief" or "evaluator", as the source named it
  // ("master" is reported as "chief").
  const std::string& job_name() const { return job_name_; }
  // Index within job_name()'s own list, as the source numbered it.
  int task_index() const { return task_index_; }
  bool is_ps() const { return job_name_ == "ps"; }
  bool is_worker() const { return worker_index_ >= 0; }  // chief included
  bool is_evaluator() const { return job_name_ == "evaluator"; }
  bool is_chief() const { return worker_index_ == 0; }
  int num_ps() const { return static_cast<int>(ps_hosts_.size()); }
  int num_workers() const { return static_cast<int>(worker_hosts_.size()); }
  // Index in worker_hosts(); -1 for ps and evaluator tasks.
  int worker_index() const { return worker_index_; }
  // GPU index on this node (SLURM_LOCALID), or -1 when unknown.
  int local_gpu() const { return local_gpu_; }
  // Address of this task ("" for an evaluator not listed in the cluster).
  const std::string& self_address() const { return self_address_; }
  // One line for logs, e.g.
  // "worker:1 (worker 1 of 2, chief=no, gpu=-1) ps=[a:1,b:1] workers=[c:1,d:1]".
  std::string to_string() const;

  bool operator==(const ClusterSpec&) const = default;

 private:
  ClusterSpec() = default;
  void finish();  // validates and fills self_address_

  std::vector<std::string> ps_hosts_;
  std::vector<std::string> worker_hosts_;
  std::vector<std::string> evaluator_hosts_;
  std::string job_name_;
  int task_index_ = -1;
  int worker_index_ = -1;
  int local_gpu_ = -1;
  std::string self_address_;
};

// Helpers, public because the launcher scripts' logic is worth testing alone.
namespace slurm {
// "node[01-03,07],gpu5" -> {node01, node02, node03, node07, gpu5}.
std::vector<std::string> expand_hostlist(std::string_view list);
// "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> expand_tasks_per_node(std::string_view spec);
}  // namespace slurm

}  // namespace ps
