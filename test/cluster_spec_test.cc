// ClusterSpec: flags, TF_CONFIG, Slurm, and the example launch files in
// scripts/ (the test derives the environment they set and parses it).
#include "ps/cluster_spec.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "ps/errors.h"

using ps::ClusterSpec;
using Env = std::map<std::string, std::string>;

// Must throw ps::ConfigError whose message contains `text`.
#define CHECK_CONFIG_ERROR(expr, text)              \
  do {                                              \
    CHECK_THROWS_AS(expr, ps::ConfigError);         \
    CHECK_THROWS_WITH(expr, Catch::Contains(text)); \
  } while (0)

using Hosts = std::vector<std::string>;

TEST_CASE("from_flags: a worker") {
  auto s = ClusterSpec::from_flags("ps0:2222,ps1:2222", "w0:2222, w1:2222 ,w2:2222", "worker", 1);
  CHECK(s.ps_hosts() == Hosts{"ps0:2222", "ps1:2222"});
  CHECK(s.worker_hosts() == Hosts{"w0:2222", "w1:2222", "w2:2222"});
  CHECK(s.job_name() == "worker");
  CHECK(s.task_index() == 1);
  CHECK(s.worker_index() == 1);
  CHECK(s.num_ps() == 2);
  CHECK(s.num_workers() == 3);
  CHECK_FALSE(s.is_chief());
  CHECK(s.is_worker());
  CHECK(s.local_gpu() == -1);
  CHECK(s.self_address() == "w1:2222");
  CHECK(s.to_string() ==
        "worker:1 (worker 1 of 3, chief=no, gpu=-1) ps=[ps0:2222,ps1:2222] "
        "workers=[w0:2222,w1:2222,w2:2222]");
}

TEST_CASE("from_flags: worker 0 is chief; chief alias; ps; unix and IPv6 addresses") {
  CHECK(ClusterSpec::from_flags("p:1", "w:1,v:1", "worker", 0).is_chief());
  auto c = ClusterSpec::from_flags("p:1", "w:1,v:1", "chief", 0);
  CHECK(c.is_chief());
  CHECK(c.worker_index() == 0);
  CHECK(c.job_name() == "chief");
  auto p = ClusterSpec::from_flags("unix:/tmp/ps0.sock,[::1]:2222", "127.0.0.1:65535", "ps", 1);
  CHECK(p.is_ps());
  CHECK_FALSE(p.is_chief());
  CHECK(p.worker_index() == -1);
  CHECK(p.self_address() == "[::1]:2222");
  CHECK(p.ps_hosts()[0] == "unix:/tmp/ps0.sock");
}

TEST_CASE("from_flags: bad input") {
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("", "w:1", "worker", 0), "--ps_hosts is empty");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", " ", "worker", 0), "--worker_hosts is empty");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("ps0", "w:1", "worker", 0), "not host:port");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:0", "w:1", "worker", 0), "1..65535");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:65536", "w:1", "worker", 0), "1..65535");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:22x", "w:1", "worker", 0), "1..65535");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:", "w:1", "worker", 0), "1..65535");
  // "h:02" would be another address than "h:2" to the duplicate check.
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w:2,w:02", "worker", 0), "no leading zeros");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags(":2222", "w:1", "worker", 0), "empty host");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1,,q:1", "w:1", "worker", 0), "empty entry");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w:1,", "worker", 0), "empty entry");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w 1:1", "worker", 0),
                     "separate hosts with ','");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1;q:1", "w:1", "worker", 0),
                     "separate hosts with ','");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w\n1:1", "worker", 0), "whitespace");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("::1:2222", "w:1", "worker", 0), "[addr]:port");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("unix:", "w:1", "worker", 0), "empty unix");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "unix:/w", "worker", 0), "only allowed for ps");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w:1", "master", 0),
                     "expected ps, worker or chief");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w:1", "worker", -1), "negative");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w:1,v:1", "worker", 2),
                     "--task_index=2 out of range: --worker_hosts has 2 entries");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w:1", "ps", 1),
                     "--task_index=1 out of range: --ps_hosts has 1 entries");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "w:1", "chief", 1), "--task_index=0");
  CHECK_CONFIG_ERROR(ClusterSpec::from_flags("p:1", "p:1", "worker", 0), "appears twice");
}

TEST_CASE("TF_CONFIG without chief: worker 0 is chief") {
  const char* j = R"({"cluster":{"worker":["w0:2222","w1:2222"],"ps":["p0:2222"]},
                      "task":{"type":"worker","index":0}})";
  auto s = ClusterSpec::from_tf_config(j);
  CHECK(s.is_chief());
  CHECK(s.worker_hosts() == Hosts{"w0:2222", "w1:2222"});
  CHECK(s.ps_hosts() == Hosts{"p0:2222"});
  auto w1 = ClusterSpec::from_tf_config(
      R"({"cluster":{"worker":["w0:2222","w1:2222"],"ps":["p0:2222"]},"task":{"type":"worker","index":1}})");
  CHECK_FALSE(w1.is_chief());
  CHECK(w1.worker_index() == 1);
  // What the Kubeflow operator adds, and other unknown keys, are ignored.
  auto p = ClusterSpec::from_tf_config(
      R"({"cluster":{"worker":["w0:1"],"ps":["p0:1","p1:1"],"foo":["x:1"]},
          "task":{"type":"ps","index":1,"trial":"3"},"environment":"cloud","rpc_layer":"grpc"})");
  CHECK(p.is_ps());
  CHECK(p.task_index() == 1);
  CHECK(p.self_address() == "p1:1");
}

TEST_CASE("TF_CONFIG with chief: chief is worker 0, workers follow") {
  const std::string cluster =
      R"("cluster":{"chief":["c:2222"],"worker":["w0:2222","w1:2222"],"ps":["p0:2222"]})";
  auto c = ClusterSpec::from_tf_config("{" + cluster + R"(,"task":{"type":"chief","index":0}})");
  CHECK(c.is_chief());
  CHECK(c.job_name() == "chief");
  CHECK(c.worker_index() == 0);
  CHECK(c.worker_hosts() == Hosts{"c:2222", "w0:2222", "w1:2222"});
  CHECK(c.num_workers() == 3);
  auto w = ClusterSpec::from_tf_config("{" + cluster + R"(,"task":{"type":"worker","index":1}})");
  CHECK_FALSE(w.is_chief());
  CHECK(w.task_index() == 1);
  CHECK(w.worker_index() == 2);
  CHECK(w.self_address() == "w1:2222");
  // TF 1.x's "master" is the chief.
  auto m = ClusterSpec::from_tf_config(
      R"({"cluster":{"master":["m:1"],"worker":["w:1"],"ps":["p:1"]},"task":{"type":"master","index":0}})");
  CHECK(m.is_chief());
  CHECK(m.job_name() == "chief");
  CHECK(m.worker_hosts() == Hosts{"m:1", "w:1"});
  // The evaluator is outside the training cluster.
  auto e =
      ClusterSpec::from_tf_config("{" + cluster + R"(,"task":{"type":"evaluator","index":0}})");
  CHECK(e.is_evaluator());
  CHECK_FALSE(e.is_chief());
  CHECK(e.worker_index() == -1);
}

TEST_CASE("TF_CONFIG: bad input") {
  const std::string cl = R"("cluster":{"worker":["w0:1","w1:1"],"ps":["p0:1"]})";
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config(""), "TF_CONFIG is empty");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config(R"({"cluster":{"worker":["w0:1"])"),
                     "not valid JSON");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config("[1,2]"), "not valid JSON");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config(R"({"cluster":{"worker":"w0:1"},"task":{}})"),
                     "not valid JSON");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config(R"({"task":{"type":"worker","index":0}})"),
                     "no \"cluster\"");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config("{" + cl + "}"), "no \"task\"");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config("{" + cl + R"(,"task":{"index":0}})"),
                     "no \"type\"");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config("{" + cl + R"(,"task":{"type":"worker"}})"),
                     "no \"index\"");
  CHECK_CONFIG_ERROR(
      ClusterSpec::from_tf_config("{" + cl + R"(,"task":{"type":"worker","index":2}})"),
      "worker:2 out of range: 2 workers listed");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config("{" + cl + R"(,"task":{"type":"ps","index":1}})"),
                     "ps:1 out of range: 1 ps listed");
  CHECK_CONFIG_ERROR(
      ClusterSpec::from_tf_config("{" + cl + R"(,"task":{"type":"chief","index":0}})"),
      "lists no chief");
  CHECK_CONFIG_ERROR(
      ClusterSpec::from_tf_config(
          R"({"cluster":{"chief":["c:1"],"worker":["w:1"],"ps":["p:1"]},"task":{"type":"chief","index":1}})"),
      "chief:1 out of range");
  CHECK_CONFIG_ERROR(
      ClusterSpec::from_tf_config("{" + cl + R"(,"task":{"type":"trainer","index":0}})"),
      "task type 'trainer' unknown");
  CHECK_CONFIG_ERROR(ClusterSpec::from_tf_config(
                         R"({"cluster":{"worker":["w0:1"]},"task":{"type":"worker","index":0}})"),
                     "no ps tasks");
  CHECK_CONFIG_ERROR(
      ClusterSpec::from_tf_config(
          R"({"cluster":{"worker":["w0"],"ps":["p:1"]},"task":{"type":"worker","index":0}})"),
      "cluster.worker: 'w0' is not host:port");
  CHECK_CONFIG_ERROR(
      ClusterSpec::from_tf_config(
          R"({"cluster":{"chief":["c:1","d:1"],"worker":["w:1"],"ps":["p:1"]},"task":{"type":"worker","index":0}})"),
      "2 chief tasks");
}

TEST_CASE("Slurm host list expansion") {
  using ps::slurm::expand_hostlist;
  CHECK(expand_hostlist("node01") == Hosts{"node01"});
  CHECK(expand_hostlist("node[01-03,07],gpu5") ==
        Hosts{"node01", "node02", "node03", "node07", "gpu5"});
  CHECK(expand_hostlist("a[8-10]") == Hosts{"a8", "a9", "a10"});
  CHECK(expand_hostlist("a[08-10]") == Hosts{"a08", "a09", "a10"});
  CHECK(expand_hostlist("n[1],m[2-3]") == Hosts{"n1", "m2", "m3"});
  CHECK(expand_hostlist("r[1-2]n[1-2]") == Hosts{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expand_hostlist("gpu-[1-2]-ib") == Hosts{"gpu-1-ib", "gpu-2-ib"});
  CHECK(expand_hostlist("10.0.0.[1-2]") == Hosts{"10.0.0.1", "10.0.0.2"});
  CHECK_CONFIG_ERROR(expand_hostlist(""), "empty entry");
  CHECK_CONFIG_ERROR(expand_hostlist("a,,b"), "empty entry");
  CHECK_CONFIG_ERROR(expand_hostlist("node[01-"), "unmatched '['");
  CHECK_CONFIG_ERROR(expand_hostlist("node]"), "unmatched ']'");
  CHECK_CONFIG_ERROR(expand_hostlist("node[3-1]"), "runs backwards");
  CHECK_CONFIG_ERROR(expand_hostlist("node[a-b]"), "not a number");
  CHECK_CONFIG_ERROR(expand_hostlist("node[]"), "empty range");
  CHECK_CONFIG_ERROR(expand_hostlist("n[0-99999999]"), "too large");
  // Each range below the limit, together above it: refused before they are expanded.
  CHECK_CONFIG_ERROR(expand_hostlist("a[0-999999],b[0-999999]"), "too many hosts");
  CHECK_CONFIG_ERROR(expand_hostlist("n[0-999999,0-999999,0-999999]"), "too many hosts");
}

TEST_CASE("Slurm tasks per node") {
  using ps::slurm::expand_tasks_per_node;
  CHECK(expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(expand_tasks_per_node("4") == std::vector<int>{4});
  CHECK(expand_tasks_per_node("1,3(x2)") == std::vector<int>{1, 3, 3});
  CHECK_CONFIG_ERROR(expand_tasks_per_node(""), "empty entry");
  CHECK_CONFIG_ERROR(expand_tasks_per_node("2(x0)"), "bad repeat");
  CHECK_CONFIG_ERROR(expand_tasks_per_node("2(3)"), "not N or N(xR)");
  CHECK_CONFIG_ERROR(expand_tasks_per_node("x"), "not a task count");
}

namespace {
Env slurm_env(int procid, int localid) {
  return {{"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NTASKS", "4"},
          {"SLURM_LOCALID", std::to_string(localid)},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_TASKS_PER_NODE", "2(x2)"}};
}
}  // namespace

TEST_CASE("from_slurm: block mapping of tasks to nodes and ports") {
  auto w = ClusterSpec::from_slurm(slurm_env(2, 0), 1, 2222);
  CHECK(w.ps_hosts() == Hosts{"gpu07:2222"});
  CHECK(w.worker_hosts() == Hosts{"gpu07:2223", "gpu08:2222", "gpu08:2223"});
  CHECK(w.job_name() == "worker");
  CHECK(w.task_index() == 1);
  CHECK(w.worker_index() == 1);
  CHECK(w.local_gpu() == 0);
  CHECK(w.self_address() == "gpu08:2222");
  auto c = ClusterSpec::from_slurm(slurm_env(1, 1), 1, 2222);
  CHECK(c.is_chief());
  CHECK(c.local_gpu() == 1);
  auto p = ClusterSpec::from_slurm(slurm_env(0, 0), 1, 2222);
  CHECK(p.is_ps());
  CHECK(p == ClusterSpec::from_slurm(slurm_env(0, 0), 1, 2222));

  // Uneven layout; SLURM_STEP_* (set by srun) win over the job's.
  Env e = slurm_env(3, 0);
  e["SLURM_TASKS_PER_NODE"] = "2(x2)";
  e["SLURM_STEP_TASKS_PER_NODE"] = "3,1";
  e["SLURM_STEP_NODELIST"] = "a,b";
  auto u = ClusterSpec::from_slurm(e, 2, 5000);
  CHECK(u.ps_hosts() == Hosts{"a:5000", "a:5001"});
  CHECK(u.worker_hosts() == Hosts{"a:5002", "b:5000"});
  CHECK(u.worker_index() == 1);

  // No tasks-per-node: spread evenly.
  Env even = slurm_env(3, 1);
  even.erase("SLURM_TASKS_PER_NODE");
  CHECK(ClusterSpec::from_slurm(even, 1, 2222).self_address() == "gpu08:2223");
}

TEST_CASE("from_slurm: bad input") {
  Env e = slurm_env(0, 0);
  e.erase("SLURM_PROCID");
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(e, 1, 2222), "SLURM_PROCID is not set");
  e = slurm_env(0, 0);
  e["SLURM_NTASKS"] = "four";
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(e, 1, 2222), "not an integer");
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(slurm_env(4, 0), 1, 2222), "out of range 0..3");
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(slurm_env(0, 0), 4, 2222), "num_ps=4 must be in 1..3");
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(slurm_env(0, 0), 0, 2222), "num_ps=0");
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(slurm_env(2, 1), 1, 2222), "--distribution=block");
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(slurm_env(1, 1), 1, 65535), "above 65535");
  e = slurm_env(0, 0);
  e["SLURM_TASKS_PER_NODE"] = "3(x2)";
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(e, 1, 2222), "add up to 6 but SLURM_NTASKS=4");
  e["SLURM_TASKS_PER_NODE"] = "1(x4)";
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(e, 1, 2222), "SLURM_JOB_NODELIST has 2");
  e = slurm_env(0, 0);
  e.erase("SLURM_TASKS_PER_NODE");
  e["SLURM_NTASKS"] = "3";
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(e, 1, 2222), "does not divide evenly");
}

TEST_CASE("from_slurm: the node slurmd names must be the one the layout gives the task") {
  Env e = slurm_env(2, 0);  // task 2: gpu08's first task
  e["SLURMD_NODENAME"] = "gpu08";
  CHECK(ClusterSpec::from_slurm(e, 1, 2222).self_address() == "gpu08:2222");
  // A layout that is not the one Slurm used would hand this task another's place.
  e["SLURMD_NODENAME"] = "gpu07";
  CHECK_CONFIG_ERROR(ClusterSpec::from_slurm(e, 1, 2222),
                     "task 2 runs on node gpu07 but the step's node list and tasks per node put it "
                     "on gpu08");
}

TEST_CASE("from_environment: TF_CONFIG first, then Slurm, else an error") {
  Env e = slurm_env(2, 0);
  CHECK(ClusterSpec::from_environment(e, 1, 2222).self_address() == "gpu08:2222");
  e["TF_CONFIG"] =
      R"({"cluster":{"worker":["w:1"],"ps":["p:1"]},"task":{"type":"worker","index":0}})";
  CHECK(ClusterSpec::from_environment(e).self_address() == "w:1");
  e["TF_CONFIG"] = "  ";  // blank: as if unset
  CHECK(ClusterSpec::from_environment(e, 1, 2222).self_address() == "gpu08:2222");
  CHECK_CONFIG_ERROR(ClusterSpec::from_environment(Env{{"HOME", "/root"}}), "set TF_CONFIG");
  ::setenv("TF_CONFIG",
           R"({"cluster":{"worker":["w:1"],"ps":["p:1"]},"task":{"type":"ps","index":0}})", 1);
  CHECK(ClusterSpec::from_environment().is_ps());
  ::unsetenv("TF_CONFIG");
}

// ---------------------------------------------------------------------------
// The example launch files. These scanners read the layout of our own two
// files (not general YAML / shell); a change there that they cannot follow
// fails the test, which is the point.

namespace {
std::string read_source(const std::string& rel) {
  const char* root = std::getenv("PS_SOURCE_DIR");  // meson test sets it
  std::string path = std::string(root ? root : PS_SOURCE_DIR_DEFAULT) + "/" + rel;
  INFO(path);
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Replica {
  std::string type;  // lower case, as the operator writes it
  int replicas = 1;
  int port = 2222;  // the operator's default
};

// TF_CONFIG the Kubeflow training operator (pkg/controller.v1/tensorflow,
// genTFConfigJSONStr) sets for task (type, index): Go's json.Marshal of
// {cluster: map sorted by key, task, environment: "cloud"}; the evaluator is
// left out of the cluster.
std::string kubeflow_tf_config(const std::string& job, const std::string& ns,
                               std::vector<Replica> reps, const std::string& type, int index) {
  std::sort(reps.begin(), reps.end(),
            [](const Replica& a, const Replica& b) { return a.type < b.type; });
  std::string j = R"({"cluster":{)";
  bool first = true;
  for (const auto& r : reps) {
    if (r.type == "evaluator") continue;
    j += (first ? "\"" : ",\"") + r.type + "\":[";
    first = false;
    for (int i = 0; i < r.replicas; ++i)
      j += (i ? ",\"" : "\"") + job + "-" + r.type + "-" + std::to_string(i) + "." + ns +
           ".svc:" + std::to_string(r.port) + "\"";
    j += "]";
  }
  j += R"(},"task":{"type":")" + type + R"(","index":)" + std::to_string(index) +
       R"(},"environment":"cloud"})";
  return j;
}
}  // namespace

TEST_CASE(
    "scripts/deploy/k8s/tfjob.yaml: the TF_CONFIG Kubeflow would set parses for every replica") {
  std::istringstream yaml(read_source("scripts/deploy/k8s/tfjob.yaml"));
  std::string line, name, ns;
  std::vector<Replica> reps;
  bool in_specs = false;
  const std::regex meta(R"(^  (name|namespace): *(\S+)\s*$)");
  const std::regex rtype(R"(^    ([A-Za-z]+):\s*$)");
  const std::regex count(R"(^      replicas: *(\d+)\s*$)");
  const std::regex port(R"(^\s+containerPort: *(\d+)\s*$)");
  std::smatch m;
  std::string previous;  // Kubeflow takes the port named tfjob-port (psd's HTTP port is another)
  for (; std::getline(yaml, line); previous = line) {
    if (!in_specs && std::regex_match(line, m, meta)) (m[1] == "name" ? name : ns) = m[2];
    if (line.find("tfReplicaSpecs:") != std::string::npos) in_specs = true;
    if (!in_specs) continue;
    if (std::regex_match(line, m, rtype)) {
      std::string t = m[1];
      std::transform(t.begin(), t.end(), t.begin(), ::tolower);
      reps.push_back({t});
    } else if (std::regex_match(line, m, count)) {
      REQUIRE(!reps.empty());
      reps.back().replicas = std::stoi(m[1]);
    } else if (std::regex_match(line, m, port) &&
               previous.find("name: tfjob-port") != std::string::npos) {
      REQUIRE(!reps.empty());
      reps.back().port = std::stoi(m[1]);
    }
  }
  REQUIRE(name == "mnist-ps");
  REQUIRE(ns == "training");
  REQUIRE(reps.size() == 3);

  std::set<std::string> addresses;
  std::set<int> worker_indices;
  int chiefs = 0, ps = 0;
  std::optional<ClusterSpec> first;
  for (const auto& r : reps) {
    for (int i = 0; i < r.replicas; ++i) {
      const std::string tf = kubeflow_tf_config(name, ns, reps, r.type, i);
      INFO(tf);
      auto s = ClusterSpec::from_tf_config(tf);
      CHECK(s.num_ps() == 2);
      CHECK(s.num_workers() == 4);
      CHECK(s.worker_hosts().front() == "mnist-ps-chief-0.training.svc:2222");
      if (!first) first = s;
      CHECK(s.ps_hosts() == first->ps_hosts());
      CHECK(s.worker_hosts() == first->worker_hosts());
      addresses.insert(s.self_address());
      chiefs += s.is_chief();
      ps += s.is_ps();
      if (s.is_worker()) worker_indices.insert(s.worker_index());
    }
  }
  CHECK(addresses.size() == 6);
  CHECK(chiefs == 1);
  CHECK(ps == 2);
  CHECK(worker_indices == std::set<int>{0, 1, 2, 3});
  // The worker with TF index 2 is the last of the combined list.
  auto w2 = ClusterSpec::from_tf_config(kubeflow_tf_config(name, ns, reps, "worker", 2));
  CHECK(w2.worker_index() == 3);
  CHECK(w2.self_address() == "mnist-ps-worker-2.training.svc:2222");
}
