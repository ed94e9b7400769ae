// psd's place in a cluster that the launcher describes in the environment:
// TF_CONFIG (as TensorFlow and Kubeflow's TFJob set it) or Slurm's SLURM_*
// variables, read with the trainers' ClusterSpec (ps/cluster_spec.h), so that
// psd and the trainers derive the same addresses from the same environment.
//
//   auto place = ps::psd_place_from_environment(ps::ClusterSpec::current_environment(),
//                                               /*slurm_num_ps=*/2, /*port_base=*/2222,
//                                               /*cluster_flag=*/"");
//   if (place) ps::finish_psd_flags(options, extra, place);
//
// Without TF_CONFIG or SLURM_PROCID: nullopt. With them but a cluster flag
// given on the command line (`cluster_flag` names it, e.g. "--port"): the
// flags win, psd logs that it ignores the environment, nullopt. An environment
// that makes this task a worker, chief or evaluator is refused (ConfigError):
// psd serves ps tasks only.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "server/psd_flags.h"

namespace ps {

std::optional<PsdPlace> psd_place_from_environment(const std::map<std::string, std::string>& env,
                                                   int slurm_num_ps, int port_base,
                                                   const std::string& cluster_flag);

}  // namespace ps
