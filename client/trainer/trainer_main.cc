#include "ps/trainer_main.h"

#include <cstdlib>

#include "ps/errors.h"

namespace ps {

int run_trainer_roles(const char* program, const TrainerFlags& flags, const TrainerRoles& roles) {
  return run_trainer_main(program, [&] {
    if (roles.prepare) roles.prepare();
    flags.validate();
    if (roles.check) roles.check();
    if (roles.local) return roles.local();
    // An evaluator is no task of the cluster: given --ps_hosts, or without
    // TF_CONFIG, it needs no --worker_hosts.
    if (roles.evaluator && flags.job_name == "evaluator" &&
        (!flags.ps_hosts.empty() || std::getenv("TF_CONFIG") == nullptr))
      return roles.evaluator(split_list(flags.ps_hosts));
    const ClusterSpec spec = flags.cluster_spec();
    if (spec.is_evaluator()) {
      if (!roles.evaluator) throw ConfigError(std::string(program) + " has no evaluator role");
      return roles.evaluator(spec.ps_hosts());
    }
    if (spec.is_ps()) {
      if (!roles.ps)
        throw ConfigError(std::string(program) + " has no ps role: start psd for the ps tasks");
      return roles.ps(spec.task_index(), spec.num_ps(), spec.self_address());
    }
    if (!spec.is_worker())
      throw ConfigError("task type '" + spec.job_name() +
                        "' is not supported (ps, worker, chief or evaluator)");
    return roles.worker(spec);
  });
}

}  // namespace ps
