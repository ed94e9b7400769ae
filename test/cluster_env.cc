// Prints the ClusterSpec that this process's environment (TF_CONFIG, else
// Slurm's SLURM_* variables) gives, as one JSON object, for the deployment
// examples' render test (test/deploy_render_test.py); exit 2 with the error.
//   cluster_env [SLURM_NUM_PS PORT_BASE]
#include <cstdio>
#include <string>

#include "ps/cluster_spec.h"
#include "ps/errors.h"

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

std::string list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + quoted(v[i]);
  return out + "]";
}

}  // namespace

int main(int argc, char** argv) {
  const int num_ps = argc > 1 ? std::stoi(argv[1]) : 1;
  const int port_base = argc > 2 ? std::stoi(argv[2]) : 2222;
  try {
    const auto s = ps::ClusterSpec::from_environment(num_ps, port_base);
    std::printf(
        "{\"job\":%s,\"task_index\":%d,\"worker_index\":%d,\"is_chief\":%s,\"self\":%s,"
        "\"local_gpu\":%d,\"ps\":%s,\"workers\":%s}\n",
        quoted(s.job_name()).c_str(), s.task_index(), s.worker_index(),
        s.is_chief() ? "true" : "false", quoted(s.self_address()).c_str(), s.local_gpu(),
        list(s.ps_hosts()).c_str(), list(s.worker_hosts()).c_str());
  } catch (const ps::Error& e) {
    std::fprintf(stderr, "cluster_env: %s\n", e.what());
    return 2;
  }
  return 0;
}
