// The worker's side of a training job, as TensorFlow's
// MonitoredTrainingSession with SyncReplicasOptimizer: the chief configures
// the job and initialises the model, the other workers wait for it; each step
// pulls the variables, lets the caller compute gradients and pushes them,
// following the job's consistency mode; the job stops at train_steps.
//
// Example (a worker's loop; `client` built with worker_index / is_chief):
//   ps::TrainingSession session(client, {.job = {.mode = ps::SyncMode::kSync,
//                                                .replicas_to_aggregate = 3,
//                                                .total_replicas = 3,
//                                                .train_steps = 1000}});
//   session.add_variable(w_spec, w, grad_w);        // caller-owned buffers
//   session.add_variable(b_spec, b, grad_b);
//   session.initialize();                           // chief inits, others wait
//   while (!session.should_stop()) {
//     session.run_step([&] { compute_gradients(w, b, grad_w, grad_b); });
//   }
//   session.end();                                  // chief: psd may exit
//
// Embedding tables (ps/embedding.h) train in the same steps: add_table()
// before initialize(), then each step set_rows() with the batch's ids and
// the caller's row and gradient buffers before run_step():
//   session.add_table(user_spec);                   // dim 16
//   session.initialize();
//   while (!session.should_stop()) {
//     session.set_rows("user", ids, rows, row_grads);  // ids.size() * 16 floats each
//     session.run_step([&] { compute(w, rows, grad_w, row_grads); });
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ps/client.h"
#include "ps/job.h"
#include "ps/tensor_spec.h"

namespace ps {

class WaitWatcher;
struct RestoredModel;

struct SessionOptions {
  JobConfig job{};
  // How long a non-chief worker waits for the chief's initialisation.
  std::chrono::milliseconds ready_timeout{300000};
  // How often it says it is still waiting.
  std::chrono::milliseconds ready_log_interval{5000};
  // Chief: start from the checkpoint under this directory (ps/checkpoint.h)
  // instead of the variables' initialisers: values, optimizer slots and
  // update counts, and the global step; tables' rows and slots too. It may
  // have been written by a job with another number of shards.
  std::string restore_from{};
};

struct StepOutcome {
  int64_t step = 0;         // the global step the variables were pulled at
  int64_t global_step = 0;  // the job's global step after this push (sync: the step it went into,
                            // counted reached by every worker alike: it closes without them now)
  bool stale = false;       // the gradients were dropped (too late for their step)
  bool stop = false;        // the job reached train_steps
};

// One thread drives a TrainingSession; its Client may serve other threads
// at the same time (an evaluator's pulls, say), as ps/client.h allows.
class TrainingSession {
 public:
  TrainingSession(Client& client, SessionOptions options);
  ~TrainingSession();

  // Binds a variable to caller buffers: pulls land in `values`, pushes read
  // `grads`. Both must have the tensor's element count and outlive the session.
  void add_variable(const TensorSpec& spec, std::span<float> values, std::span<float> grads);

  // Binds an embedding table: the chief creates it in initialize() (with
  // restore_from, with the checkpoint's rows and slots); the others check
  // that the chief created it so. Before initialize().
  void add_table(const TableSpec& spec);
  // The rows of the next step of a table added: pull() reads the rows of
  // `ids` into `rows`, push() sends `grads` (each ids.size() * dim floats).
  // The buffers are the caller's and stay bound until set again. A table
  // with no ids set is pushed empty (a sync step counts every table).
  void set_rows(const std::string& table, std::span<const int64_t> ids, std::span<float> rows,
                std::span<const float> grads);

  // Chief: configures the job, creates and initialises the variables and
  // tables, marks the model ready. Others: wait for that (logging while they
  // wait) and throw ConnectionError after ready_timeout; then check that
  // they declared what the chief created (names, shapes, shards; tables'
  // dims and kinds), or throw ConfigError. A job already at its stop step
  // has should_stop() at once; another worker that finds a job restored from
  // a checkpoint at its stop step waits (saying so) for this run's chief,
  // which may move the stop step, or end the job.
  void initialize();

  // Registers each tensor of one flat parameter buffer as a variable:
  // `tensors` is a range of {name, shape, offset, count} (ps/mlp.h's
  // ParamLayout::tensors()); each gets its slice of `params` and `grads`,
  // the name `prefix` + its own, `optimizer`, and Glorot-uniform values
  // (matrices, seeded `seed`, `seed` + 1, ... in order) or zeros (the rest).
  // Returns the next seed not used.
  //   seed = session.add_variables(mlp.layout().tensors(), mlp.params(), mlp.grads(), adam, seed);
  template <typename Tensors>
  uint64_t add_variables(const Tensors& tensors, std::span<float> params, std::span<float> grads,
                         const OptimizerConfig& optimizer, uint64_t seed,
                         const std::string& prefix = "") {
    for (const auto& t : tensors) {
      add_variable(
          {.name = prefix + t.name,
           .shape = std::vector<uint64_t>(t.shape.begin(), t.shape.end()),
           .optimizer = optimizer,
           .init = t.shape.size() == 2 ? InitConfig::glorot_uniform(seed++) : InitConfig::zeros()},
          params.subspan(t.offset, t.count), grads.subspan(t.offset, t.count));
    }
    return seed;
  }

  // Reads the variables and the tables' rows for the next step, waiting as
  // the mode requires (sync: the next global step; bounded staleness: until
  // this worker is within max_staleness of the slowest). In sync mode all
  // of them come from one global step (but for a shard restarted from an
  // older checkpoint, read as it is). Returns the global step read.
  int64_t pull();
  // Sends the gradients and rows' gradients for the step last pulled and
  // reports the step done, as one step (Client::push_and_step). After a
  // pull that found the job at its stop step (should_stop()), sends nothing
  // and returns stop: the step would be past train_steps.
  StepOutcome push();
  // pull(), compute(), push().
  StepOutcome run_step(const std::function<void()>& compute);

  // Reads every variable into its buffer as psd holds it now, waiting for
  // no step (the chief's final evaluation, after the last step).
  PullResult pull_latest();

  // Examples one global step consumes with `batch_size` per worker step, as
  // the job the chief configured counts them (sync: replicas_to_aggregate
  // batches; otherwise one).
  int64_t examples_per_global_step(int batch_size) const;

  bool should_stop() const { return stop_; }
  int64_t global_step() const { return global_step_; }
  // The job's global step when this session started (initialize()): 0 for a
  // new job, the step a restored or resumed one goes on from. Rates and
  // epochs of this run count from here.
  int64_t start_step() const { return start_step_; }
  // This worker's steps in the job; a restarted worker in bounded staleness
  // goes on from the count psd recorded for it.
  int64_t local_step() const { return local_step_; }
  // The steps this session ran (local_step() less where it started): what
  // this process's rates and per-step times count.
  int64_t steps_run() const { return local_step_ - local_start_; }
  uint64_t stale_steps() const { return stale_steps_; }
  bool is_chief() const { return client_.options().is_chief; }
  const JobConfig& job() const { return options_.job; }
  // The variables added (add_variable), in order.
  const std::vector<std::string>& variable_names() const { return names_; }
  Client& client() { return client_; }

  // Client::barrier, saying every few seconds (as pull does in a long
  // wait) which workers it waits for, as psd sees them.
  uint32_t barrier(const std::string& name, uint32_t count, std::chrono::milliseconds timeout,
                   LostWorkers lost = LostWorkers::kWaitFor);

  // Chief: tells the shards the job is over; they exit once workers leave.
  void end();

 private:
  // Chief with restore_from: the variables as the checkpoint holds them.
  std::vector<TensorSpec> restored_specs(const RestoredModel& m);
  // Chief with restore_from, before anything is created: ConfigError for a
  // table that is not in the checkpoint, or is there with another dim, kind,
  // row count or row optimizer, or whose rows would not fit its row limit
  // on this job's shards.
  void check_restored_tables(const RestoredModel& m) const;
  // Chief with restore_from, after create_tables: the tables' rows and slots.
  void restore_tables(const RestoredModel& m);
  // Another worker: the tables added here are those the chief created.
  void check_tables_as_created();
  // Another worker: the variables as declared here are those the chief
  // created, with the same shapes, on the same shards; throws ConfigError.
  void check_declared_as_created();
  // Another worker: started with the chief's cluster (the lists and the
  // worker count in its job); throws ConfigError naming both.
  void check_same_cluster(const JobConfig& chiefs) const;
  // Another worker, in initialize(): the job as psd has it once no chief
  // may still move its stop step (see initialize()).
  ShardStats job_once_settled();
  // Sync mode: whether `step` is past the job's stop step, as psd has it
  // now (a chief may have moved it since this session read the job).
  bool sync_stop_at(int64_t step);

  Client& client_;
  SessionOptions options_;
  std::vector<TensorSpec> specs_;
  std::vector<std::string> names_;
  std::vector<std::span<float>> values_;
  std::vector<std::span<const float>> grads_;
  struct BoundTable {
    TableSpec spec;
    std::span<const int64_t> ids;
    std::span<float> rows;
    std::span<const float> grads;
  };
  std::vector<BoundTable> tables_;
  int64_t pulled_step_ = 0;
  int64_t next_sync_step_ = 0;
  int64_t global_step_ = 0;
  int64_t start_step_ = 0;
  int64_t local_step_ = 0;
  int64_t local_start_ = 0;
  uint64_t stale_steps_ = 0;
  uint64_t seen_rollbacks_ = 0;  // Client::rollbacks() when last checked
  bool stop_ = false;
  bool initialized_ = false;
  // From initialize(): logs what a pull, push or barrier waiting for long waits for.
  std::unique_ptr<WaitWatcher> watch_;
};

}  // namespace ps
