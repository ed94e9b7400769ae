#include "ps/training_session.h"

#include <algorithm>
#include <map>
#include <thread>

#include <spdlog/spdlog.h>

#include "client/table_rows.h"
#include "client/trainer/wait_watcher.h"
#include "ps/checkpoint.h"

namespace ps {

TrainingSession::TrainingSession(Client& client, SessionOptions options)
    : client_(client), options_(std::move(options)) {}

TrainingSession::~TrainingSession() = default;

void TrainingSession::add_variable(const TensorSpec& spec, std::span<float> values,
                                   std::span<float> grads) {
  if (initialized_) throw ConfigError("add_variable('" + spec.name + "') after initialize()");
  if (std::find(names_.begin(), names_.end(), spec.name) != names_.end())
    throw ConfigError("add_variable: variable '" + spec.name + "' twice");
  if (values.size() != spec.num_elements() || grads.size() != spec.num_elements()) {
    throw ConfigError("variable '" + spec.name + "' has " + std::to_string(spec.num_elements()) +
                      " elements; its buffers hold " + std::to_string(values.size()) + " and " +
                      std::to_string(grads.size()));
  }
  specs_.push_back(spec);
  names_.push_back(spec.name);
  values_.push_back(values);
  grads_.emplace_back(grads.data(), grads.size());
}

void TrainingSession::add_table(const TableSpec& spec) {
  if (initialized_) throw ConfigError("add_table('" + spec.name + "') after initialize()");
  for (const BoundTable& t : tables_) {
    if (t.spec.name == spec.name) throw ConfigError("add_table: table '" + spec.name + "' twice");
  }
  tables_.push_back(BoundTable{spec, {}, {}, {}});
}

void TrainingSession::set_rows(const std::string& table, std::span<const int64_t> ids,
                               std::span<float> rows, std::span<const float> grads) {
  auto it = std::find_if(tables_.begin(), tables_.end(),
                         [&](const BoundTable& t) { return t.spec.name == table; });
  if (it == tables_.end()) throw ConfigError("set_rows: no table '" + table + "' (add_table it)");
  const std::size_t n = ids.size() * it->spec.dim;
  if (rows.size() != n || grads.size() != n) {
    throw ConfigError("set_rows: table '" + table + "' has dim " + std::to_string(it->spec.dim) +
                      ": " + std::to_string(ids.size()) + " ids need " + std::to_string(n) +
                      " floats; the buffers hold " + std::to_string(rows.size()) + " and " +
                      std::to_string(grads.size()));
  }
  it->ids = ids;
  it->rows = rows;
  it->grads = grads;
}

void TrainingSession::initialize() {
  std::vector<TableSpec> table_specs;
  for (const BoundTable& t : tables_) table_specs.push_back(t.spec);
  if (is_chief()) {
    RestoredModel m;
    if (!options_.restore_from.empty()) m = load_checkpoint(options_.restore_from);
    std::vector<TensorSpec> specs = options_.restore_from.empty() ? specs_ : restored_specs(m);
    if (!options_.restore_from.empty()) check_restored_tables(m);
    try {
      client_.init_job(options_.job);
    } catch (const RequestError& e) {
      // The job on psd refuses this chief's configuration (a stop step behind
      // it, another mode): the flags' to change, as any bad flag.
      std::string why = e.what();
      if (why.rfind("initJob: ", 0) == 0) why.erase(0, 9);
      throw ConfigError(why);
    }
    client_.create(specs);
    if (!table_specs.empty()) {
      client_.create_tables(table_specs);
      if (!options_.restore_from.empty()) restore_tables(m);
    }
    start_step_ = client_.stats().front().global_step;
    // Only now may the workers start: the model is whole, tables included.
    client_.set_ready();
    if (!options_.restore_from.empty()) {
      spdlog::info(
          "chief: job configured ({}), {} variables and {} tables restored from {} "
          "(global step {})",
          to_string(options_.job), specs_.size(), tables_.size(), options_.restore_from,
          start_step_);
    } else if (start_step_ > 0) {
      // psd restored its own checkpoint: create() found the model there.
      spdlog::info(
          "chief: job configured ({}), going on from global step {} with the {} "
          "variables and {} tables psd restored",
          to_string(options_.job), start_step_, specs_.size(), tables_.size());
    } else {
      spdlog::info("chief: job configured ({}), {} variables and {} tables created and initialised",
                   to_string(options_.job), specs_.size(), tables_.size());
    }
  } else {
    client_.declare(specs_);
    if (!table_specs.empty()) client_.declare_tables(table_specs);
    const auto start = std::chrono::steady_clock::now();
    while (!client_.wait_ready(std::min(options_.ready_log_interval, options_.ready_timeout))) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= options_.ready_timeout) {
        throw ConnectionError("the chief did not initialise the model within " +
                              std::to_string(options_.ready_timeout.count() / 1000) +
                              " s (is worker 0 running?)");
      }
      spdlog::info("worker {}: waiting for the chief (worker 0) to initialise the model ({} s of {} s)",
                   client_.options().worker_index,
                   std::chrono::duration_cast<std::chrono::seconds>(waited).count(),
                   options_.ready_timeout.count() / 1000);
    }
    check_same_cluster(client_.job());
    const ShardStats settled = job_once_settled();
    options_.job = settled.job;
    start_step_ = settled.global_step;
    check_declared_as_created();
    check_tables_as_created();
  }
  global_step_ = start_step_;
  // A job at its stop step has nothing to train: a trainer's first pull would
  // otherwise run one more step (async) or wait for one that never comes.
  if (options_.job.train_steps > 0 && start_step_ >= options_.job.train_steps) stop_ = true;
  // Bounded staleness measures every worker by its own step count: a
  // restarted worker going on from 0 was ignored until it passed its old
  // count, and the others ran that far past max_staleness meanwhile.
  if (options_.job.mode == SyncMode::kBoundedStaleness)
    local_step_ = std::max(local_step_, client_.recorded_step());
  local_start_ = local_step_;
  watch_ = std::make_unique<WaitWatcher>(client_, client_.options().worker_index);
  initialized_ = true;
}

ShardStats TrainingSession::job_once_settled() {
  // A psd restored from its checkpoint at the job's stop step is ready at
  // once, but this run's chief may yet move the stop step (a job going on):
  // deciding now, from the restored job, ended this worker while the chief
  // trained the rest alone.
  const auto start = std::chrono::steady_clock::now();
  auto said = start;
  ShardStats st = client_.stats().front();
  while (st.awaiting_chief && !st.finished && st.job.train_steps > 0 &&
         st.global_step >= st.job.train_steps) {
    const auto now = std::chrono::steady_clock::now();
    if (now - start >= options_.ready_timeout) break;  // taken as over: nothing to train
    if (now - said >= options_.ready_log_interval) {
      said = now;
      spdlog::info(
          "worker {}: the job was restored at its stop step {}: waiting for the chief (worker 0) "
          "to go on with more steps or end it ({} s of {} s)",
          client_.options().worker_index, st.job.train_steps,
          std::chrono::duration_cast<std::chrono::seconds>(now - start).count(),
          options_.ready_timeout.count() / 1000);
    }
    const auto& interrupted = client_.options().interrupted;
    if (interrupted && interrupted()) {
      throw InterruptedError("worker " + std::to_string(client_.options().worker_index) +
                             ": interrupted while waiting for the chief to go on with the job");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    st = client_.stats().front();
  }
  return st;
}

bool TrainingSession::sync_stop_at(int64_t step) {
  if (options_.job.train_steps <= 0 || step < options_.job.train_steps) return false;
  // Once, at the end: the stop step as psd has it now.
  const int64_t now = client_.stats().front().job.train_steps;
  if (now > options_.job.train_steps) options_.job.train_steps = now;
  return step >= options_.job.train_steps;
}

namespace {
std::string joined(const std::vector<std::string>& hosts) {
  std::string out;
  for (const auto& h : hosts) out += (out.empty() ? "" : ",") + h;
  return out;
}
}  // namespace

void TrainingSession::check_same_cluster(const JobConfig& chiefs) const {
  // A worker started with another cluster than the chief's trains, but
  // the end barrier counts the wrong number of workers, or a worker index
  // means another task: refused here, at the start, with both lists.
  const JobConfig& mine = options_.job;
  const std::string who = "worker " + std::to_string(client_.options().worker_index);
  auto differ = [&](const char* flag, const std::vector<std::string>& a,
                    const std::vector<std::string>& b) {
    if (a.empty() || b.empty() || a == b) return;
    throw ConfigError(who + " was started with " + flag + "=" + joined(a) + " (" +
                      std::to_string(a.size()) + "), the chief with " + flag + "=" + joined(b) +
                      " (" + std::to_string(b.size()) +
                      "): start every task with the same cluster");
  };
  differ("--worker_hosts", mine.worker_hosts, chiefs.worker_hosts);
  differ("--ps_hosts", mine.ps_hosts, chiefs.ps_hosts);
  if (mine.total_replicas > 0 && chiefs.total_replicas > 0 &&
      mine.total_replicas != chiefs.total_replicas) {
    throw ConfigError(who + " counts " + std::to_string(mine.total_replicas) +
                      " workers, the chief's job " + std::to_string(chiefs.total_replicas) +
                      ": start every task with the same --worker_hosts");
  }
}

void TrainingSession::check_declared_as_created() {
  // psd checks only each part's length: a worker that declared [3, 2] for
  // the chief's [2, 3], or its variables in another order (other shards),
  // would otherwise train on values it reads wrong, or fail at its first push.
  std::map<std::string, TensorInfo> created;
  for (auto& t : client_.list()) created.emplace(t.name, std::move(t));
  const Placement placement = client_.placement();
  for (const TensorSpec& declared : specs_) {
    auto it = created.find(declared.name);
    const std::string here = "worker " + std::to_string(client_.options().worker_index) +
                             ": variable '" + declared.name + "'";
    if (it == created.end()) {
      throw ConfigError(
          here + " was not created by the chief: every worker must declare the same variables");
    }
    if (it->second.shape != declared.shape) {
      throw ConfigError(here + " is declared with shape " + shape_to_string(declared.shape) +
                        ", the chief created " + shape_to_string(it->second.shape) +
                        ": every worker must declare the same model");
    }
    std::vector<int> shards;
    for (const Part& p : placement.at(declared.name).parts) shards.push_back(p.shard);
    std::sort(shards.begin(), shards.end());
    shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
    if (shards != it->second.shards) {
      throw ConfigError(
          here +
          " is placed on other shards here than where the chief created it: every worker must "
          "declare the variables in the same order, with the same placement and chunk size");
    }
  }
}

void TrainingSession::check_tables_as_created() {
  std::map<std::string, Client::TableInfo> created;
  for (auto& t : client_.list_tables()) created.emplace(t.name, std::move(t));
  for (const BoundTable& declared : tables_) {
    const std::string here = "worker " + std::to_string(client_.options().worker_index) +
                             ": table '" + declared.spec.name + "'";
    auto it = created.find(declared.spec.name);
    if (it == created.end()) {
      throw ConfigError(here +
                        " was not created by the chief: every worker must add the same tables");
    }
    const Client::TableInfo& c = it->second;
    if (c.dim != declared.spec.dim || c.dynamic != declared.spec.dynamic ||
        (!c.dynamic && c.rows != declared.spec.rows)) {
      auto kind = [](bool dynamic, uint64_t rows) {
        return dynamic ? std::string("dynamic") : "fixed with " + std::to_string(rows) + " rows";
      };
      throw ConfigError(here + " is added as " + kind(declared.spec.dynamic, declared.spec.rows) +
                        ", dim " + std::to_string(declared.spec.dim) + "; the chief created it " +
                        kind(c.dynamic, c.rows) + ", dim " + std::to_string(c.dim) +
                        ": every worker must add the same tables");
    }
  }
}

void TrainingSession::check_restored_tables(const RestoredModel& m) const {
  for (const BoundTable& declared : tables_) {
    const TableSpec& spec = declared.spec;
    auto it = std::find_if(m.tables.begin(), m.tables.end(),
                           [&](const RestoredTable& t) { return t.spec.name == spec.name; });
    if (it == m.tables.end()) {
      throw ConfigError("restore: table '" + spec.name + "' is not in the checkpoint under " +
                        options_.restore_from);
    }
    const TableSpec& saved = it->spec;
    if (saved.dim != spec.dim || saved.dynamic != spec.dynamic ||
        (!spec.dynamic && saved.rows != spec.rows)) {
      throw ConfigError("restore: table '" + spec.name + "' is added with dim " +
                        std::to_string(spec.dim) + (spec.dynamic ? ", dynamic" : ", fixed") +
                        ", the checkpoint's has dim " + std::to_string(saved.dim) +
                        (saved.dynamic ? ", dynamic" : ", fixed") +
                        " (fixed tables: the same rows too)");
    }
    // Slots mean something only to the optimizer that made them, and psd
    // takes a row with all its optimizer's slots.
    if (saved.optimizer.kind != spec.optimizer.kind) {
      throw ConfigError("restore: table '" + spec.name +
                        "' was trained with another row optimizer than it is added with");
    }
    check_restore_fits(spec, it->ids, static_cast<uint32_t>(client_.num_shards()), "restore");
  }
}

void TrainingSession::restore_tables(const RestoredModel& m) {
  for (const BoundTable& declared : tables_) {
    const TableSpec& spec = declared.spec;
    auto it = std::find_if(m.tables.begin(), m.tables.end(),
                           [&](const RestoredTable& t) { return t.spec.name == spec.name; });
    if (it == m.tables.end()) continue;  // check_restored_tables refused it
    client_.restore_rows(spec.name, it->ids, it->values, it->slots, it->version, it->ages);
  }
  if (!tables_.empty()) {
    spdlog::info("chief: restored {} tables from step {} of {}", tables_.size(), m.global_step,
                 options_.restore_from);
  }
}

std::vector<TensorSpec> TrainingSession::restored_specs(const RestoredModel& m) {
  options_.job.start_step = m.global_step;
  std::vector<TensorSpec> specs;
  for (const TensorSpec& declared : specs_) {
    auto it = std::find_if(m.tensors.begin(), m.tensors.end(),
                           [&](const TensorSpec& t) { return t.name == declared.name; });
    if (it == m.tensors.end()) {
      throw ConfigError("restore: variable '" + declared.name +
                        "' is not in the checkpoint under " + options_.restore_from);
    }
    if (it->shape != declared.shape) {
      throw ConfigError("restore: variable '" + declared.name + "' has shape " +
                        shape_to_string(declared.shape) + ", the checkpoint's " +
                        shape_to_string(it->shape));
    }
    TensorSpec spec = declared;  // the optimizer as declared now (a new learning rate is fine)
    spec.init = it->init;
    // Slots only mean something to the optimizer that made them. The update
    // count goes on (the learning-rate schedule counts it), except into
    // Adam from another optimizer: its bias correction counts from fresh
    // moments, and a count of thousands on zero moments made its first
    // steps 3-6x the learning rate. Its schedule starts again with it.
    spec.version = it->version;
    if (declared.optimizer.kind == it->optimizer.kind) {
      spec.slots = it->slots;
    } else if (declared.optimizer.kind == OptimizerKind::kAdam) {
      spec.version = 0;
      spdlog::warn(
          "restore: variable '{}' was trained with another optimizer; Adam starts afresh on it "
          "(update "
          "count 0: its learning-rate schedule starts again too)",
          declared.name);
    }
    specs.push_back(std::move(spec));
  }
  spdlog::info("chief: restoring {} variables from step {} of {} ({} shards)", specs.size(),
               m.global_step, options_.restore_from, m.num_shards);
  return specs;
}

int64_t TrainingSession::pull() {
  if (!initialized_) throw ConfigError("pull() before initialize()");
  if (const uint64_t r = client_.rollbacks(); r != seen_rollbacks_) {
    // A shard restarted: the step this session waits for may never come.
    // Start again from whatever step the shards are at.
    seen_rollbacks_ = r;
    next_sync_step_ = 0;
    spdlog::warn("a ps shard restarted; going on from the step it is at");
  }
  int64_t min_step = 0;
  switch (options_.job.mode) {
    case SyncMode::kSync:
      min_step = next_sync_step_;
      break;
    case SyncMode::kBoundedStaleness:
      min_step = local_step_;
      break;
    case SyncMode::kAsync:
      break;
  }
  // The tables with ids this step, read with the variables at one step; in
  // sync mode every table, as push() sends every table to every shard.
  std::vector<RowsInto> rows;
  for (const BoundTable& t : tables_) {
    if (!t.ids.empty() || options_.job.mode == SyncMode::kSync)
      rows.push_back(RowsInto{t.spec.name, t.ids, t.rows});
  }
  int64_t step = 0;
  {
    WaitWatcher::Scope w(watch_.get(),
                         options_.job.mode == SyncMode::kSync ? "pull for the next sync step"
                         : options_.job.mode == SyncMode::kBoundedStaleness
                             ? "pull (waits for the slowest worker)"
                             : "pull",
                         client_.options().call_timeout);
    step = rows.empty() ? client_.pull(names_, values_, min_step).step
                        : client_.pull_with_rows(names_, values_, rows, min_step).step;
  }
  pulled_step_ = step;
  if (options_.job.mode == SyncMode::kSync) {
    global_step_ = step;
    // A worker that fell behind may find the job already done.
    if (sync_stop_at(step)) stop_ = true;
  }
  return step;
}

StepOutcome TrainingSession::push() {
  // The last pull found the job at its stop step (a sync worker that fell
  // behind): gradients pushed now would go into a step past train_steps.
  if (stop_) return StepOutcome{pulled_step_, global_step_, false, true};
  const int64_t step =
      options_.job.mode == SyncMode::kBoundedStaleness ? local_step_ : pulled_step_;
  // The step report rides on the push: the shard counts it once the
  // gradients are in, without another round trip.
  // Tables' rows go in the same step, every table's (a sync step counts
  // each table; one without ids goes empty).
  std::vector<RowGrads> rows;
  for (const BoundTable& t : tables_) rows.push_back(RowGrads{t.spec.name, t.ids, t.grads});
  PushResult p;
  {
    WaitWatcher::Scope w(watch_.get(), "push", client_.options().call_timeout);
    p = client_.push_and_step(names_, grads_, rows, step, local_step_);
  }

  StepOutcome out;
  out.step = pulled_step_;
  for (PushStatus s : p.status)
    out.stale = out.stale || s == PushStatus::kStale || s == PushStatus::kDuplicate;
  for (PushStatus s : p.row_status)
    out.stale = out.stale || s == PushStatus::kStale || s == PushStatus::kDuplicate;
  if (out.stale) ++stale_steps_;
  ++local_step_;
  if (options_.job.mode == SyncMode::kSync) {
    // A reply at an older step than pulled: a shard restarted behind us.
    next_sync_step_ = p.step < pulled_step_ ? p.step : pulled_step_ + 1;
    // The step this gradient went into closes with it or with the others'
    // (lost workers are not waited for): every worker reports it reached,
    // not only the one whose push closed it (the others said one step less,
    // 99 of 100 at the end).
    global_step_ = std::max(p.step, next_sync_step_);
    stop_ = sync_stop_at(next_sync_step_);
  } else {
    global_step_ = p.global_step;
    stop_ = p.stop;
  }
  out.global_step = global_step_;
  out.stop = stop_;
  return out;
}

StepOutcome TrainingSession::run_step(const std::function<void()>& compute) {
  pull();
  if (stop_) return StepOutcome{pulled_step_, global_step_, false, true};
  compute();
  return push();
}

uint32_t TrainingSession::barrier(const std::string& name, uint32_t count,
                                  std::chrono::milliseconds timeout, LostWorkers lost) {
  WaitWatcher::Scope w(watch_.get(), "barrier", timeout);
  return client_.barrier(name, count, timeout, lost);
}

void TrainingSession::end() {
  if (is_chief()) client_.finish();
}

PullResult TrainingSession::pull_latest() { return client_.pull(names_, values_); }

int64_t TrainingSession::examples_per_global_step(int batch_size) const {
  const JobConfig& j = options_.job;
  return static_cast<int64_t>(batch_size) *
         (j.mode == SyncMode::kSync ? std::max<int64_t>(1, j.replicas_to_aggregate) : 1);
}

}  // namespace ps
