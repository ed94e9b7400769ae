#include "ps/trainer_main.h"

#include "ps/errors.h"

namespace ps {

int run_trainer_roles(const char* program, const TrainerFlags& flags, const TrainerRoles& roles) {
  return run_trainer_main(program, [&] {
    if (roles.prepare) roles.prepare();
    flags.validate();
    if (roles.check) roles.check();
    if (roles.local) return roles.local();
    const ClusterSpec spec = flags.cluster_spec();
    if (spec.is_ps()) {
      if (!roles.ps)
        throw ConfigError(std::string(program) + " has no ps role: start psd for the ps tasks");
      return roles.ps(spec.task_index(), spec.num_ps(), spec.self_address());
    }
    if (!spec.is_worker())
      throw ConfigError("task type '" + spec.job_name() +
                        "' is not supported (ps, worker or chief)");
    return roles.worker(spec);
  });
}

}  // namespace ps
