// The evaluator task (TensorFlow's `evaluator` task type): a process beside
// the job that evaluates the model as training goes on, so the workers never
// stop for it. It reads the parameters either from the newest checkpoint in a
// psd --checkpoint_dir (each new one once; the one at the job's stop step is
// the last), or by pulling them from psd at intervals (a tool connection:
// it is no worker, and never holds up a step), and hands each new snapshot to
// the caller's evaluation.
//
// Example (mnist_trainer --job_name=evaluator does this):
//   ps::EvaluatorOptions o;
//   o.checkpoint_dir = "/tmp/ckpt";             // or: o.client = &client; o.tensors = {...};
//   ps::run_evaluator(o, [&](const ps::ParameterSnapshot& s) {
//     double acc = my_accuracy(s.tensors.at("layer0/weights"), ...);
//     summaries.add_scalar("accuracy/test", acc, s.global_step);
//   });
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ps {

class Client;

// A model's parameters at one global step.
struct ParameterSnapshot {
  int64_t global_step = 0;
  // The job's last parameters: the checkpoint at its stop step, or pulled once
  // the job had finished. The evaluator stops after this one.
  bool final = false;
  std::map<std::string, std::vector<float>> tensors;  // whole logical tensors, by name
};

struct EvaluatorOptions {
  // Read checkpoints from here (psd --checkpoint_dir, every shard's files);
  // empty: pull from `client`.
  std::string checkpoint_dir;
  Client* client = nullptr;  // a tool's Client (worker_index -1) to the job's psds
  // The model's tensors, in the order the chief created them (pulling places
  // them by that order, as the chief did); a checkpoint without all of them
  // is passed over.
  std::vector<std::string> tensors;
  // How often to look for a newer checkpoint or global step.
  std::chrono::milliseconds interval{10000};
  // Stop after this long without new parameters (the job may have died).
  std::chrono::milliseconds timeout{300000};
  std::string who = "evaluator";  // the name its log lines start with
};

struct EvaluatorResult {
  int64_t evaluations = 0;
  int64_t last_step = -1;       // the last global step evaluated (-1: none)
  bool saw_final = false;       // it evaluated the job's last parameters
  std::string stopped_because;  // for people: why it stopped
};

// Calls `evaluate` once for each snapshot newer than the last one, until the
// final one, `timeout` without a new one, or (pulling) psd going away after
// the job finished. Says what it waits for every 5 s. Throws ConfigError
// when neither source is given, CheckpointError for a checkpoint whose files
// are all unreadable, and ConnectionError when psd cannot be reached at
// first. `evaluate` may throw; that ends the evaluator.
EvaluatorResult run_evaluator(const EvaluatorOptions& options,
                              const std::function<void(const ParameterSnapshot&)>& evaluate);

// The newest step for which every shard under `dir` has a checkpoint file
// (by the files' names; not read), or nothing.
std::optional<int64_t> newest_checkpoint_step(const std::string& dir);

}  // namespace ps
