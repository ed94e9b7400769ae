#include "server/psd_environment.h"

#include <spdlog/spdlog.h>

#include "ps/cluster_spec.h"
#include "ps/errors.h"

namespace ps {

namespace {

bool has_value(const std::map<std::string, std::string>& env, const char* key) {
  auto it = env.find(key);
  return it != env.end() && it->second.find_first_not_of(" \t\r\n") != std::string::npos;
}

}  // namespace

std::optional<PsdPlace> psd_place_from_environment(const std::map<std::string, std::string>& env,
                                                   int slurm_num_ps, int port_base,
                                                   const std::string& cluster_flag) {
  // The same order as ClusterSpec::from_environment: TF_CONFIG first, then Slurm.
  const char* source = has_value(env, "TF_CONFIG")      ? "TF_CONFIG"
                       : has_value(env, "SLURM_PROCID") ? "Slurm's SLURM_* variables"
                                                        : nullptr;
  if (!source) return std::nullopt;
  if (!cluster_flag.empty()) {
    spdlog::info("psd: {} given on the command line: ignoring {} (the flags name the shard)",
                 cluster_flag, source);
    return std::nullopt;
  }
  const ClusterSpec spec = ClusterSpec::from_environment(env, slurm_num_ps, port_base);
  if (!spec.is_ps()) {
    throw ConfigError(std::string(source) + ": this task is " + spec.job_name() + ":" +
                      std::to_string(spec.task_index()) +
                      ", not a ps task: psd serves ps tasks only (run the trainer for this task)");
  }
  spdlog::info("psd: shard {} of {} at {}, from {}", spec.task_index(), spec.num_ps(),
               spec.self_address(), source);
  return PsdPlace{
      .task_index = spec.task_index(), .num_ps = spec.num_ps(), .address = spec.self_address()};
}

}  // namespace ps
