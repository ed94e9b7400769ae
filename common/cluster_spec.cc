// ClusterSpec parsing: flags, TF_CONFIG (capnp-json), Slurm.
#include "ps/cluster_spec.h"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/exception.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include "ps/errors.h"
#include "common/tf_config.capnp.h"

extern char** environ;

namespace ps {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw ConfigError(msg); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Parses a decimal integer that must fill the whole string.
bool parse_int(std::string_view s, long long& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Validates one address; `what` names the list for the message.
void check_address(std::string_view addr, bool allow_unix, const std::string& what) {
  std::string a(addr);
  if (addr.starts_with("unix:")) {
    if (!allow_unix) fail(what + ": '" + a + "': unix: addresses are only allowed for ps tasks");
    if (addr.size() == 5) fail(what + ": '" + a + "': empty unix socket path");
    return;
  }
  for (char c : addr) {
    if (c == ';' || c == ' ' || c == '\t')
      fail(what + ": '" + a + "': separate hosts with ',' (host:port,host:port)");
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',')
      fail(what + ": '" + a + "': whitespace or comma inside an address");
  }
  auto colon = addr.rfind(':');
  if (colon == std::string_view::npos) fail(what + ": '" + a + "' is not host:port");
  std::string_view host = addr.substr(0, colon), port = addr.substr(colon + 1);
  if (host.empty()) fail(what + ": '" + a + "' has an empty host");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') fail(what + ": '" + a + "': bad [IPv6] host");
  } else if (host.find(':') != std::string_view::npos) {
    fail(what + ": '" + a + "': IPv6 hosts must be written [addr]:port");
  }
  long long p = 0;
  // No leading zeros: "h:02" would pass as another address than "h:2".
  if (!parse_int(port, p) || p < 1 || p > 65535 || port.front() == '0')
    fail(what + ": '" + a + "': port must be a number in 1..65535 (no leading zeros)");
}

std::vector<std::string> split_hosts(std::string_view list, bool allow_unix,
                                     const std::string& what) {
  std::vector<std::string> out;
  list = trim(list);
  if (list.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t comma = list.find(',', start);
    std::string_view item = trim(list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (item.empty()) fail(what + ": empty entry in '" + std::string(list) + "'");
    check_address(item, allow_unix, what);
    out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
  return s;
}

const std::string* find_env(const std::map<std::string, std::string>& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

long long env_int(const std::map<std::string, std::string>& env, const char* key) {
  const std::string* v = find_env(env, key);
  if (!v) fail(std::string("Slurm: ") + key + " is not set");
  long long x = 0;
  if (!parse_int(trim(*v), x))
    fail(std::string("Slurm: ") + key + "='" + *v + "' is not an integer");
  return x;
}

}  // namespace

void ClusterSpec::finish() {
  if (ps_hosts_.empty()) fail("cluster has no ps tasks");
  if (worker_hosts_.empty()) fail("cluster has no worker (or chief) tasks");
  std::set<std::string> seen;
  for (const auto* list : {&ps_hosts_, &worker_hosts_, &evaluator_hosts_})
    for (const auto& h : *list)
      if (!seen.insert(h).second) fail("address '" + h + "' appears twice in the cluster");
  if (task_index_ < 0) fail("task index " + std::to_string(task_index_) + " is negative");
  if (job_name_ == "ps") {
    if (task_index_ >= num_ps())
      fail("task index " + std::to_string(task_index_) +
           " out of range: " + std::to_string(num_ps()) + " ps tasks");
    self_address_ = ps_hosts_[task_index_];
  } else if (job_name_ == "evaluator") {
    if (!evaluator_hosts_.empty()) {
      if (task_index_ >= static_cast<int>(evaluator_hosts_.size()))
        fail("task index " + std::to_string(task_index_) +
             " out of range: " + std::to_string(evaluator_hosts_.size()) + " evaluator tasks");
      self_address_ = evaluator_hosts_[task_index_];
    }
  } else {
    if (worker_index_ < 0 || worker_index_ >= num_workers())
      fail("task " + job_name_ + ":" + std::to_string(task_index_) +
           " out of range: " + std::to_string(num_workers()) + " workers (chief included)");
    self_address_ = worker_hosts_[worker_index_];
  }
}

ClusterSpec ClusterSpec::from_flags(std::string_view ps_hosts, std::string_view worker_hosts,
                                    std::string_view job_name, int task_index) {
  ClusterSpec s;
  s.ps_hosts_ = split_hosts(ps_hosts, /*allow_unix=*/true, "--ps_hosts");
  s.worker_hosts_ = split_hosts(worker_hosts, false, "--worker_hosts");
  if (s.ps_hosts_.empty()) fail("--ps_hosts is empty");
  if (s.worker_hosts_.empty()) fail("--worker_hosts is empty");
  s.job_name_ = std::string(trim(job_name));
  s.task_index_ = task_index;
  if (s.job_name_ == "worker") {
    s.worker_index_ = task_index;
  } else if (s.job_name_ == "chief") {
    if (task_index != 0)
      fail("--job_name=chief needs --task_index=0 (the chief is worker 0), got " +
           std::to_string(task_index));
    s.worker_index_ = 0;
  } else if (s.job_name_ != "ps") {
    fail("--job_name='" + s.job_name_ + "': expected ps, worker or chief");
  }
  if (task_index < 0) fail("--task_index=" + std::to_string(task_index) + " is negative");
  if (s.job_name_ == "ps" && task_index >= s.num_ps())
    fail("--task_index=" + std::to_string(task_index) + " out of range: --ps_hosts has " +
         std::to_string(s.num_ps()) + " entries");
  if (s.job_name_ == "worker" && task_index >= s.num_workers())
    fail("--task_index=" + std::to_string(task_index) + " out of range: --worker_hosts has " +
         std::to_string(s.num_workers()) + " entries");
  s.finish();
  return s;
}

ClusterSpec ClusterSpec::from_tf_config(std::string_view json) {
  if (trim(json).empty()) fail("TF_CONFIG is empty");
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<tfconfig::TfConfig>();
  try {
    capnp::JsonCodec codec;
    codec.setMaxNestingDepth(16);
    codec.decode(kj::ArrayPtr<const char>(json.data(), json.size()), root);
  } catch (const kj::Exception& e) {
    fail("TF_CONFIG is not valid JSON of the expected shape: " +
         std::string(e.getDescription().cStr()));
  }
  auto cfg = root.asReader();
  if (!cfg.hasCluster()) fail("TF_CONFIG has no \"cluster\"");
  if (!cfg.hasTask()) fail("TF_CONFIG has no \"task\"");
  auto cluster = cfg.getCluster();
  auto task = cfg.getTask();
  if (!task.hasType()) fail("TF_CONFIG \"task\" has no \"type\"");
  if (task.getIndex() == -1) fail("TF_CONFIG \"task\" has no \"index\" (or it is -1)");

  auto list = [](capnp::List<capnp::Text>::Reader l, bool allow_unix, const std::string& what) {
    std::vector<std::string> out;
    for (auto t : l) {
      std::string_view a = trim(std::string_view(t.cStr(), t.size()));
      check_address(a, allow_unix, what);
      out.emplace_back(a);
    }
    return out;
  };
  ClusterSpec s;
  s.ps_hosts_ = list(cluster.getPs(), true, "TF_CONFIG cluster.ps");
  auto chief = list(cluster.getChief(), false, "TF_CONFIG cluster.chief");
  auto master = list(cluster.getMaster(), false, "TF_CONFIG cluster.master");
  auto workers = list(cluster.getWorker(), false, "TF_CONFIG cluster.worker");
  s.evaluator_hosts_ = list(cluster.getEvaluator(), false, "TF_CONFIG cluster.evaluator");
  if (!chief.empty() && !master.empty()) fail("TF_CONFIG lists both \"chief\" and \"master\"");
  if (chief.empty()) chief = std::move(master);
  if (chief.size() > 1)
    fail("TF_CONFIG lists " + std::to_string(chief.size()) + " chief tasks, at most 1 allowed");
  s.worker_hosts_ = chief;
  s.worker_hosts_.insert(s.worker_hosts_.end(), workers.begin(), workers.end());

  std::string type(task.getType().cStr());
  if (type == "master") type = "chief";
  s.job_name_ = type;
  s.task_index_ = task.getIndex();
  const int offset = static_cast<int>(chief.size());
  if (type == "chief") {
    if (chief.empty()) fail("TF_CONFIG task type is chief but the cluster lists no chief");
    if (s.task_index_ != 0)
      fail("TF_CONFIG task chief:" + std::to_string(s.task_index_) + " out of range: 1 chief");
    s.worker_index_ = 0;
  } else if (type == "worker") {
    if (s.task_index_ < 0 || s.task_index_ >= static_cast<int>(workers.size()))
      fail("TF_CONFIG task worker:" + std::to_string(s.task_index_) +
           " out of range: " + std::to_string(workers.size()) + " workers listed");
    s.worker_index_ = offset + s.task_index_;
  } else if (type == "ps") {
    if (s.task_index_ < 0 || s.task_index_ >= s.num_ps())
      fail("TF_CONFIG task ps:" + std::to_string(s.task_index_) +
           " out of range: " + std::to_string(s.num_ps()) + " ps listed");
  } else if (type != "evaluator") {
    fail("TF_CONFIG task type '" + type + "' unknown: expected chief, worker, ps or evaluator");
  }
  s.finish();
  return s;
}

ClusterSpec ClusterSpec::from_slurm(const std::map<std::string, std::string>& env, int num_ps,
                                    int port_base) {
  const long long rank = env_int(env, "SLURM_PROCID");
  const long long ntasks = env_int(env, "SLURM_NTASKS");
  const long long local_id = env_int(env, "SLURM_LOCALID");
  // srun sets the step's node list; sbatch's environment has the job's.
  const std::string* nodelist = find_env(env, "SLURM_STEP_NODELIST");
  if (!nodelist) nodelist = find_env(env, "SLURM_JOB_NODELIST");
  if (!nodelist) nodelist = find_env(env, "SLURM_NODELIST");
  if (!nodelist) fail("Slurm: SLURM_JOB_NODELIST is not set");
  if (ntasks < 2 || ntasks > 1000000)
    fail("Slurm: SLURM_NTASKS=" + std::to_string(ntasks) +
         ": need at least 2 tasks (1 ps + 1 worker)");
  if (rank < 0 || rank >= ntasks)
    fail("Slurm: SLURM_PROCID=" + std::to_string(rank) + " out of range 0.." +
         std::to_string(ntasks - 1));
  if (num_ps < 1 || num_ps >= ntasks)
    fail("Slurm: num_ps=" + std::to_string(num_ps) + " must be in 1.." +
         std::to_string(ntasks - 1) + " for SLURM_NTASKS=" + std::to_string(ntasks));
  if (port_base < 1 || port_base > 65535)
    fail("Slurm: port base " + std::to_string(port_base) + " out of range 1..65535");

  std::vector<std::string> nodes = slurm::expand_hostlist(*nodelist);
  // Tasks per node: the step's own layout if srun set it, else the job's.
  std::vector<int> per_node;
  const std::string* tpn = find_env(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!tpn) tpn = find_env(env, "SLURM_TASKS_PER_NODE");
  if (tpn) {
    per_node = slurm::expand_tasks_per_node(*tpn);
  } else {
    if (ntasks % static_cast<long long>(nodes.size()) != 0)
      fail("Slurm: SLURM_TASKS_PER_NODE is not set and SLURM_NTASKS=" + std::to_string(ntasks) +
           " does not divide evenly over " + std::to_string(nodes.size()) + " nodes");
    per_node.assign(nodes.size(), static_cast<int>(ntasks / static_cast<long long>(nodes.size())));
  }
  // A step may use fewer nodes than the job allocation; never more.
  if (per_node.size() > nodes.size())
    fail("Slurm: tasks-per-node lists " + std::to_string(per_node.size()) +
         " nodes but SLURM_JOB_NODELIST has " + std::to_string(nodes.size()));
  long long total = 0;
  for (int c : per_node) total += c;
  if (total != ntasks)
    fail("Slurm: tasks per node add up to " + std::to_string(total) +
         " but SLURM_NTASKS=" + std::to_string(ntasks));

  // Block distribution: tasks fill node 0, then node 1, ...
  ClusterSpec s;
  std::vector<std::string> all;
  all.reserve(static_cast<size_t>(ntasks));
  int my_local = -1;
  std::string my_node;
  for (size_t n = 0; n < per_node.size(); ++n) {
    for (int l = 0; l < per_node[n]; ++l) {
      if (port_base + l > 65535)
        fail("Slurm: port " + std::to_string(port_base + l) + " above 65535 (port base " +
             std::to_string(port_base) + " + local rank " + std::to_string(l) + ")");
      if (static_cast<long long>(all.size()) == rank) {
        my_local = l;
        my_node = nodes[n];
      }
      all.push_back(nodes[n] + ":" + std::to_string(port_base + l));
    }
  }
  if (my_local != local_id)
    fail("Slurm: SLURM_LOCALID=" + std::to_string(local_id) + " but block distribution puts task " +
         std::to_string(rank) + " at local rank " + std::to_string(my_local) +
         "; run srun with --distribution=block");
  // slurmd names the node a task runs on: a layout read wrongly (another
  // distribution, a step spread otherwise) would give this task another's
  // address, and so another's shard or worker index.
  if (const std::string* here = find_env(env, "SLURMD_NODENAME"); here && *here != my_node)
    fail("Slurm: task " + std::to_string(rank) + " runs on node " + *here +
         " but the step's node list and tasks per node put it on " + my_node +
         "; run srun with --distribution=block");
  for (const auto& h : all) check_address(h, false, "Slurm node list");
  s.ps_hosts_.assign(all.begin(), all.begin() + num_ps);
  s.worker_hosts_.assign(all.begin() + num_ps, all.end());
  if (rank < num_ps) {
    s.job_name_ = "ps";
    s.task_index_ = static_cast<int>(rank);
  } else {
    s.job_name_ = "worker";
    s.task_index_ = static_cast<int>(rank - num_ps);
    s.worker_index_ = s.task_index_;
  }
  s.local_gpu_ = static_cast<int>(local_id);
  s.finish();
  return s;
}

ClusterSpec ClusterSpec::from_environment(const std::map<std::string, std::string>& env, int num_ps,
                                          int port_base) {
  const std::string* tf = find_env(env, "TF_CONFIG");
  if (tf && !trim(*tf).empty()) return from_tf_config(*tf);
  if (find_env(env, "SLURM_PROCID")) return from_slurm(env, num_ps, port_base);
  fail(
      "no cluster description: set TF_CONFIG, run under Slurm (srun), or pass "
      "--ps_hosts/--worker_hosts/--job_name/--task_index");
}

ClusterSpec ClusterSpec::from_environment(int num_ps, int port_base) {
  return from_environment(current_environment(), num_ps, port_base);
}

std::map<std::string, std::string> ClusterSpec::current_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

std::string ClusterSpec::to_string() const {
  std::string s = job_name_ + ":" + std::to_string(task_index_);
  if (worker_index_ >= 0)
    s += " (worker " + std::to_string(worker_index_) + " of " + std::to_string(num_workers()) +
         ", chief=" + (is_chief() ? "yes" : "no") + ", gpu=" + std::to_string(local_gpu_) + ")";
  else
    s += " (gpu=" + std::to_string(local_gpu_) + ")";
  s += " ps=[" + join(ps_hosts_) + "] workers=[" + join(worker_hosts_) + "]";
  if (!evaluator_hosts_.empty()) s += " evaluators=[" + join(evaluator_hosts_) + "]";
  return s;
}

}  // namespace ps
