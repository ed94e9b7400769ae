// The main of a between-graph replicated trainer (TensorFlow's one program
// for every role): once the flags are parsed, one call runs the role the
// cluster gives this process (ps, worker or chief, or none with a --local
// of the program's own), inside run_trainer_main's error handling, so every
// trainer checks, dispatches and fails alike: one line on stderr and exit
// code 2 for a bad flag, 3 for an unreachable ps.
//
// Example (the whole main; run_worker is the program's training loop):
//   #include "ps/trainer_main.h"
//   #include "server/ps_task.h"   // psd's entry point for --job_name=ps
//
//   int main(int argc, char** argv) {
//     CLI::App app{"my_trainer"};
//     ps::TrainerFlags f;
//     ps::add_trainer_flags(app, f);
//     int examples = 1000;
//     app.add_option("--examples", examples, "examples per worker");
//     ps::PsTaskFlags psf;
//     ps::add_ps_task_flags(app, psf);  // after the trainer's flags
//     PS_PARSE_FLAGS(app, argc, argv);
//     return ps::run_trainer_roles(
//         "my_trainer", f,
//         {.prepare = [&] { ps::apply_log_level(psf); },
//          .check = [&] { if (examples < 1) throw ps::ConfigError("--examples must be >= 1"); },
//          .ps = [&](int task, int num_ps, const std::string& address) {
//            return ps::run_ps_task(task, num_ps, address, psf);
//          },
//          .worker = [&](const ps::ClusterSpec& spec) { return run_worker(spec, f, examples); }});
//   }
//
// The ps role is the program's to give: the trainer framework links only
// the client, a trainer binary links psd's entry point (server/ps_task.h).
#pragma once

#include <functional>
#include <string>

#include "ps/cluster_spec.h"
#include "ps/trainer_flags.h"

namespace ps {

struct TrainerRoles {
  // First of all (the log level, which the ps role's flags carry). Throws ConfigError.
  std::function<void()> prepare{};
  // After TrainerFlags::validate(): the program's own flag checks. Throws ConfigError.
  std::function<void()> check{};
  // Set: the program runs alone, with no cluster and no psd (a --local
  // flag of its own); the cluster flags are not read. Returns the exit code.
  std::function<int()> local{};
  // --job_name=ps: serves shard `task_index` of `num_ps` on `self_address`
  // until the job ends (ps::run_ps_task). Unset: a ps role is a ConfigError.
  std::function<int(int task_index, int num_ps, const std::string& self_address)> ps{};
  // --job_name=worker or chief: trains. Returns the exit code.
  std::function<int(const ClusterSpec& spec)>
      worker{};  // --job_name=evaluator (or a TF_CONFIG task of type evaluator): evaluates
  // the job's parameters from `ps_hosts` (empty: the program's checkpoints)
  // without being a task of the cluster. Unset: an evaluator is a ConfigError.
  std::function<int(const std::vector<std::string>& ps_hosts)> evaluator{};
};

// In run_trainer_main(program, ...): roles.prepare, flags.validate(),
// roles.check, then roles.local where set, else the cluster
// (flags.cluster_spec(): the flags, TF_CONFIG or Slurm) and the role it
// gives this process. Any other task type is a ConfigError. Returns the
// exit code.
int run_trainer_roles(const char* program, const TrainerFlags& flags, const TrainerRoles& roles);

}  // namespace ps
