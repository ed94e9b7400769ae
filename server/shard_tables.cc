// Shard: embedding tables. Requests come as plain values
// (server/table_requests.h); every one is checked whole before a
// row changes. Sync mode counts a table like a trainable tensor: a step
// completes when every tensor and every table has its replicas' gradients.
#include "server/shard_tables.h"

#include <set>

#include <spdlog/spdlog.h>

#include "common/finite.h"
#include "common/tensor_name.h"
#include "ps/errors.h"
#include "server/embedding/row_buffers.h"
#include "server/shard.h"

namespace ps {

ShardTable& ShardTables::get(std::string_view name, const char* what) {
  try {
    check_name(name, "table");  // the same rule as at create, on the full bytes sent
  } catch (const RequestError& e) {
    throw RequestError(std::string(what) + ": " + e.what());
  }
  auto it = tables.find(name);
  if (it == tables.end()) {
    throw RequestError(std::string(what) + ": no table '" + std::string(name) +
                       "' on this shard (createTables first)");
  }
  return it->second;
}

uint64_t ShardTables::bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tables) {
    n += t.table->bytes() + bookkeeping_bytes(name) + t.sync.bytes() +
         t.table->bytes_for_new_rows(t.sync.new_rows);
  }
  return n;
}

Shard::~Shard() = default;

namespace {

// The memory `fresh` more rows of t would take, beyond the rows its open
// sync step will create (ShardTables::bytes() counts those as held).
uint64_t bytes_for_more_rows(const ShardTable& t, uint64_t fresh) {
  const uint64_t pending = t.sync.new_rows;
  return t.table->bytes_for_new_rows(pending + fresh) - t.table->bytes_for_new_rows(pending);
}

// Of a sync push's ids, the distinct ones the step's earlier pushes did
// not name (each grows the step's sums by a row), and of those the ones the
// step's commit will create (not held; where the table admits by count,
// admitted by this push).
struct NewToStep {
  uint64_t ids = 0;
  uint64_t rows = 0;
};
NewToStep new_to_step(const ShardTable& t, std::span<const uint64_t> ids) {
  FirstPositions seen;  // keyed: ids picked to collide do not slow it
  seen.reset(ids.size());
  NewToStep n;
  for (uint32_t i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    if (t.sync.position.contains(id) || seen.first(id, i) != i) continue;
    ++n.ids;
    if (!t.table->holds(id) && t.table->would_create(id, EmbeddingTable::Creating::kByPush))
      ++n.rows;
  }
  return n;
}

TableReport report_of(const ShardTable& t, bool created) {
  TableReport r;
  r.spec = t.table->spec();
  r.rows_here = t.table->rows();
  r.bytes = t.table->bytes();
  r.version = t.table->version();
  r.evictions = t.table->evictions();
  r.ids_filtered = t.table->ids_filtered();
  r.rows_expired = t.table->rows_expired();
  r.rows_pulled = t.rows_pulled;
  r.rows_pushed = t.rows_pushed;
  r.created = created;
  return r;
}

bool same_table(const TableSpec& a, const TableSpec& b) {
  return a.dim == b.dim && a.rows == b.rows && a.dynamic == b.dynamic &&
         a.placement == b.placement && a.optimizer.kind == b.optimizer.kind &&
         a.row_limit == b.row_limit && a.on_limit == b.on_limit &&
         std::max(a.min_count, 1u) == std::max(b.min_count, 1u) &&
         (a.min_count <= 1 || a.count_sketch_width == b.count_sketch_width) &&
         a.expire_after_steps == b.expire_after_steps;
}

// The filters on a dynamic table's rows: ", min_count N[, count_sketch_width
// W]" for a table admitting ids by count, ", expire_after_steps S" for one
// whose rows expire.
std::string row_filters_of(const TableSpec& s) {
  std::string out;
  if (s.min_count > 1) {
    out += ", min_count " + std::to_string(s.min_count);
    if (s.count_sketch_width != 0)
      out += ", count_sketch_width " + std::to_string(s.count_sketch_width);
  }
  if (s.expire_after_steps != 0)
    out += ", expire_after_steps " + std::to_string(s.expire_after_steps);
  return out;
}

std::string describe(const TableSpec& s) {
  return (s.dynamic ? std::string("dynamic") : "fixed " + std::to_string(s.rows) + "-row") +
         " table of dim " + std::to_string(s.dim) + " (" + row_optimizer_name(s.optimizer.kind) +
         row_filters_of(s) + ")";
}

}  // namespace

uint64_t Shard::table_count() const { return tables_->tables.size(); }

void Shard::check_memory(uint64_t extra, const std::string& what) const {
  if (budget_ != nullptr) {
    // One budget for everything psd holds: the tables as they are now, then what is asked for.
    tables_->reserved.resize_anyway(tables_->bytes());
    if (extra > budget_->available()) {
      budget_->count_refusal();
      throw RequestError(what + " would take psd over its memory limit: " + budget_->describe());
    }
    return;
  }
  const uint64_t limit = options_.limits.max_total_bytes;
  const uint64_t used = store_.bytes() + tables_->bytes();
  if (used > limit || extra > limit - used) {
    throw RequestError(what + " would take this shard to " + std::to_string(used + extra) +
                       " bytes, over its limit of " + std::to_string(limit) +
                       " (psd --max_memory_mb)");
  }
}

std::vector<TableReport> Shard::create_tables(const std::vector<ShardTableSpec>& specs,
                                              bool validate_only) {
  std::set<std::string> names;
  uint64_t new_bytes = 0;
  std::size_t new_tables = 0;
  for (const ShardTableSpec& s : specs) {
    EmbeddingTable::validate(s.spec);
    const std::string& name = s.spec.name;
    if (!names.insert(name).second)
      throw RequestError("createTables: table '" + name + "' appears twice in one request");
    if (s.num_shards == 0 || s.shard_index >= s.num_shards) {
      throw RequestError("createTables: table '" + name + "' placed on shard " +
                         std::to_string(s.shard_index) + " of " + std::to_string(s.num_shards));
    }
    if (options_.num_shards > 1 &&
        (s.num_shards != options_.num_shards || s.shard_index != options_.shard_index)) {
      throw RequestError("createTables: the client placed table '" + name + "' on shard " +
                         std::to_string(s.shard_index) + " of " + std::to_string(s.num_shards) +
                         ", but this psd is shard " + std::to_string(options_.shard_index) +
                         " of " + std::to_string(options_.num_shards));
    }
    auto it = tables_->tables.find(name);
    if (it != tables_->tables.end()) {
      const ShardTable& t = it->second;
      if (!same_table(t.table->spec(), s.spec) || t.num_shards != s.num_shards) {
        throw RequestError("createTables: table '" + name + "' exists as a " +
                           describe(t.table->spec()) + " over " + std::to_string(t.num_shards) +
                           " shards; asked for a " + describe(s.spec) + " over " +
                           std::to_string(s.num_shards));
      }
      continue;
    }
    // Saturating: initial_bytes says UINT64_MAX for a table too large to count.
    const uint64_t rows = EmbeddingTable::initial_bytes(s.spec, s.shard_index, s.num_shards);
    const uint64_t extra = ShardTables::bookkeeping_bytes(name);
    const uint64_t b = rows > UINT64_MAX - extra ? UINT64_MAX : rows + extra;
    new_bytes = b > UINT64_MAX - new_bytes ? UINT64_MAX : new_bytes + b;
    ++new_tables;
  }
  const uint64_t max_tables = options_.limits.max_tables;
  if (new_tables > max_tables - std::min<uint64_t>(max_tables, tables_->tables.size())) {
    throw RequestError("createTables: a shard holds at most " + std::to_string(max_tables) +
                       " tables; this one has " + std::to_string(tables_->tables.size()) +
                       " and the request adds " + std::to_string(new_tables));
  }
  check_memory(new_bytes, "createTables: the new tables (" + std::to_string(new_bytes) + " bytes)");
  std::vector<TableReport> out;
  if (validate_only) return out;
  for (const ShardTableSpec& s : specs) {
    auto it = tables_->tables.find(s.spec.name);
    bool created = false;
    if (it == tables_->tables.end()) {
      ShardTable t;
      const unsigned helpers =
          std::min(std::max(options_.table_threads, 1u), pool_.threads() + 1) - 1;
      t.table = std::make_unique<EmbeddingTable>(
          s.spec, s.shard_index, s.num_shards,
          RunParts{helpers + 1, [this, helpers](std::size_t parts, const PartFn& fn) {
                     pool_.run_parts(parts, helpers, fn);
                   }});
      t.num_shards = s.num_shards;
      t.table->advance_to_step(job_.global_step());  // its rows are stamped from this step on
      it = tables_->tables.emplace(s.spec.name, std::move(t)).first;
      created = true;
      spdlog::info("created {} '{}' ({} rows here, {} MiB)", describe(s.spec), s.spec.name,
                   it->second.table->rows(), it->second.table->bytes() >> 20);
    }
    out.push_back(report_of(it->second, created));
  }
  if (budget_ != nullptr) tables_->reserved.resize_anyway(tables_->bytes());
  counters_.creates += specs.size();
  return out;
}

void Shard::check_sync_additions(const Caller& caller,
                                 const std::vector<ShardTableSpec>& specs) const {
  for (const ShardTableSpec& s : specs)
    if (!tables_->tables.count(s.spec.name))
      refuse_sync_addition(caller, "createTables", "table", s.spec.name);
}

std::vector<TableReport> Shard::list_tables() const {
  std::vector<TableReport> out;
  for (const auto& [name, t] : tables_->tables) out.push_back(report_of(t, false));
  return out;
}

kj::Promise<void> Shard::pull_rows(const Caller& caller, PullRowsRequest r, RowsOut out) {
  saw_worker(caller.worker_index);
  ShardTable& t = tables_->get(r.table, "pullRows");
  const uint64_t bytes = uint64_t(r.ids.size()) * t.table->dim() * sizeof(float);
  if (bytes + 4096 > options_.max_message_bytes) {
    throw RequestError(
        "pullRows: " + std::to_string(r.ids.size()) + " rows of table '" + t.table->spec().name +
        "' take " + std::to_string(bytes) + " bytes, over this psd's message limit of " +
        std::to_string(options_.max_message_bytes) + " (--max_message_mb); pull fewer ids at once");
  }
  const int64_t min_step = checked_step(std::max<int64_t>(r.min_step, 0), "pullRows");
  const auto creating =
      r.lookup ? EmbeddingTable::Creating::kNone : EmbeddingTable::Creating::kByPull;
  auto read = [this, &t, r, creating, out = std::move(out)]() {
    if (const uint64_t fresh = t.table->check(r.ids, "pullRows", creating); fresh > 0) {
      check_memory(bytes_for_more_rows(t, fresh), "pullRows: " + std::to_string(fresh) +
                                                      " new rows of table '" +
                                                      t.table->spec().name + "'");
    }
    float* dest = out(r.ids.size() * t.table->dim(), job_.global_step());
    if (r.lookup) {
      t.table->lookup(r.ids, dest);
    } else {
      t.table->pull(r.ids, dest);
    }
    t.rows_pulled += r.ids.size();
    ++counters_.pulls;
    counters_.bytes_out += r.ids.size() * t.table->dim() * sizeof(float);
  };
  if (job_.config().mode == SyncMode::kAsync) {
    read();
    return kj::READY_NOW;
  }
  t.table->check(r.ids, "pullRows", creating);  // refused now rather than after the wait
  kj::Promise<void> wait = job_.config().mode == SyncMode::kSync
                               ? job_.wait_for_step(min_step, caller.worker_index)
                               : job_.wait_for_staleness(min_step, caller.worker_index);
  return wait.then(kj::mv(read));
}

bool Shard::apply_table_update(EmbeddingTable& table, std::span<const uint64_t> ids,
                               std::span<const float> grads, float scale, uint64_t new_rows,
                               std::optional<bool> within_bound, EmbeddingTable::Repeats repeats) {
  if (!options_.allow_nonfinite)
    return table.push_if_finite(ids, grads, scale, new_rows, within_bound, repeats);
  table.push(ids, grads, scale, repeats);
  return true;
}

PushRowsReply Shard::push_rows(const Caller& caller, const PushRowsRequest& r) {
  const int64_t step = checked_step(r.step, "pushRows");
  if (r.done_step >= 0) checked_step(r.done_step, "pushRows (doneStep)");
  const JobConfig& job = job_.config();
  job_.check_worker(caller.worker_index);
  if (r.done_step >= 0 && caller.worker_index < 0) {
    throw RequestError("pushRows: only workers report steps (say hello with a worker index)");
  }
  saw_worker(caller.worker_index);
  PushRowsReply reply;
  if (r.request_id != 0) {
    if (const RecentRequest* seen = requests_.find(requester(caller), r.request_id)) {
      // A retry of a push already applied (its reply was lost).
      ++counters_.duplicate_requests;
      reply.step = seen->step;
      if (!seen->statuses.empty()) reply.status = static_cast<GradientStatus>(seen->statuses[0]);
      if (r.done_step >= 0) {
        reply.step = job_.global_step();
        reply.stop = job_.stop_reached();
      }
      return reply;
    }
  }
  if (job_.configured() && !job_.ready()) {
    throw RequestError(
        "pushRows: the chief has not finished initialising the model (waitReady first)");
  }
  ShardTable& t = tables_->get(r.table, "pushRows");
  const TableSpec& spec = t.table->spec();
  const uint32_t dim = spec.dim;
  if (r.grads.size() != r.ids.size() * dim) {
    throw RequestError("pushRows: table '" + spec.name + "' has dim " + std::to_string(dim) + ": " +
                       std::to_string(r.ids.size()) + " ids need " +
                       std::to_string(r.ids.size() * dim) + " gradient floats, got " +
                       std::to_string(r.grads.size()));
  }
  const uint32_t summed = gradients_summed_per_step(job);
  const bool sync = job.mode == SyncMode::kSync;
  // The pass that refuses NaN/Inf also tells whether every gradient is
  // within the table's safe bound (the smaller limit first; the larger only
  // where that fails). In sync mode, half of it: a step's sum of such
  // pushes, averaged, is then within it too (TableSyncSlot::within_bound).
  const float limit = gradient_limit(summed);
  const float bound = options_.allow_nonfinite
                          ? 0.0f
                          : t.table->safe_gradient_bound(1.0f, r.ids.size()) / (sync ? 2 : 1);
  const float first = bound > 0 ? std::min(limit, bound) : limit;
  std::span<const float> grads = r.grads;
  std::shared_ptr<float> copied;  // the gradients out of shared memory, as checked
  bool finite;
  if (r.grads_shared) {
    copied = RowBuffers::process().take(r.grads.size());
    finite = copy_all_finite(copied.get(), r.grads.data(), r.grads.size(), first);
    grads = std::span<const float>(copied.get(), r.grads.size());
  } else {
    finite = options_.allow_nonfinite || all_finite(grads, first);
  }
  std::optional<bool> within_bound;
  if (bound > 0) within_bound = finite;
  if (!finite && first < limit) finite = all_finite(grads, limit);
  if (!options_.allow_nonfinite && !finite) {
    throw RequestError(gradient_refusal(spec.name, grads, summed));
  }
  // A sync push the open step does not take (stale, a backup worker's
  // after enough arrived, a repeat) creates no rows: its ids are checked,
  // not the room for them.
  const TableSyncSlot& open_step = t.sync;
  const bool creates_rows =
      !sync || (step == job_.global_step() && !open_step.complete &&
                std::find(open_step.contributors.begin(), open_step.contributors.end(),
                          caller.worker_index) == open_step.contributors.end());
  uint64_t fresh = 0;
  if (creates_rows) {
    fresh = t.table->check(r.ids, "pushRows", EmbeddingTable::Creating::kByPush);
  } else {
    t.table->check_ids(r.ids, "pushRows");
  }
  // A sync push's new rows are created at the step's commit, with those of
  // the other workers' pushes: it is charged for the ones they did not name
  // (and for what summing it may add to the step's buffers).
  uint64_t rows_new_to_step = 0;
  uint64_t extra = 0;
  std::size_t step_ids_reserved = r.ids.size();  // room made in the step's buffers
  if (sync && creates_rows) {
    // Worked out id by id only where rows are new or the step's buffers
    // would grow: a step whose rows were pulled first, in buffers a step
    // before it sized, costs nothing more.
    if (fresh > 0 || t.sync.growth(r.ids.size(), r.ids.size(), dim) > 0) {
      const NewToStep n = new_to_step(t, r.ids);
      rows_new_to_step = n.rows;
      step_ids_reserved = n.ids;
      extra = t.sync.growth(r.ids.size(), n.ids, dim);
    }
    fresh = rows_new_to_step;
  }
  if (fresh > 0 || extra > 0) {
    check_memory(bytes_for_more_rows(t, fresh) + extra,
                 "pushRows: " + std::to_string(fresh) + " new rows of table '" + spec.name + "'");
  }
  if (!sync) {
    // Applied now (not summed for a sync step), before the request is
    // counted: refused whole if it would store a NaN or Inf, as a dense
    // update is.
    const auto repeats =
        r.ids_distinct ? EmbeddingTable::Repeats::kSenderSaysNone : EmbeddingTable::Repeats::kMaybe;
    if (!apply_table_update(*t.table, r.ids, grads, 1.0f, fresh, within_bound, repeats)) {
      throw RequestError(
          "pushRows: the update would make a value or optimizer slot of table '" + spec.name +
          "' NaN or Inf (a gradient or learning rate too large); nothing was applied");
    }
  } else {
    if (caller.worker_index < 0)
      throw RequestError("pushRows: sync mode needs a worker index (say hello as a worker)");
    if (r.parts > 1) {
      throw RequestError(
          "pushRows: table '" + spec.name + "': this push came to this shard in " +
          std::to_string(r.parts) +
          " requests, as a client that takes the job for async sends a large one; in sync mode a "
          "worker's push counts once a step and must come whole (the client learns the job's "
          "mode when it connects or waits for the chief: call wait_ready, as TrainingSession "
          "does, before pushing)");
    }
    if (step > job_.global_step()) {
      throw RequestError("pushRows: gradient for step " + std::to_string(step) +
                         ", but the job is at step " + std::to_string(job_.global_step()) +
                         " (a push carries the step its rows were pulled at)");
    }
  }
  WorkerRecord* worker = caller.worker_index >= 0 ? &job_.worker(caller.worker_index) : nullptr;
  if (worker) {
    ++worker->pushes;
    if (!sync && step > worker->step) {
      worker->step = step;
      job_.worker_progressed();
    }
  }
  if (job.mode == SyncMode::kBoundedStaleness && worker)
    job_.record_staleness(step - job_.slowest_live_step());
  ++counters_.pushes;
  counters_.bytes_in += grads.size_bytes();
  t.rows_pushed += r.ids.size();
  reply.step = job_.global_step();

  if (sync && step < job_.global_step()) {
    reply.status = GradientStatus::kStale;
    ++counters_.stale;
    if (worker) ++worker->stale;
  } else if (sync) {
    TableSyncSlot& slot = t.sync;
    if (slot.complete) {
      reply.status = GradientStatus::kStale;  // a backup worker's, after enough arrived
      ++counters_.stale;
      if (worker) ++worker->stale;
    } else if (std::find(slot.contributors.begin(), slot.contributors.end(), caller.worker_index) !=
               slot.contributors.end()) {
      reply.status = GradientStatus::kDuplicate;
    } else {
      slot.contributors.push_back(caller.worker_index);
      ++slot.count;
      slot.within_bound = slot.within_bound && within_bound.value_or(false);
      slot.reserve(r.ids.size(), step_ids_reserved, dim);  // the room charged above
      for (std::size_t i = 0; i < r.ids.size(); ++i) {
        const auto next = static_cast<uint32_t>(slot.ids.size());
        const uint32_t at = slot.position.first(r.ids[i], next);
        if (at == next) {
          slot.ids.push_back(r.ids[i]);
          slot.sum.insert(slot.sum.end(), grads.begin() + i * dim, grads.begin() + (i + 1) * dim);
        } else {
          float* s = slot.sum.data() + std::size_t(at) * dim;
          for (uint32_t j = 0; j < dim; ++j) s[j] += grads[i * dim + j];
        }
      }
      slot.new_rows += rows_new_to_step;
      reply.status = GradientStatus::kAccumulated;
      if (slot.count >= table_replicas_needed(slot.contributors)) {
        slot.complete = true;
        ++complete_tensors_;
      }
    }
  } else {
    reply.status = GradientStatus::kApplied;  // above, before anything was counted
  }
  if (r.request_id != 0) {
    requests_.record(
        requester(caller),
        RecentRequest{r.request_id, job_.global_step(), {static_cast<uint8_t>(reply.status)}});
  }
  if (sync && complete_tensors_ > 0 && complete_tensors_ >= trainable_count()) commit_sync_step();
  if (r.done_step >= 0) {
    auto [global, stop] = step_done(caller, r.done_step);
    reply.step = global;
    reply.stop = stop;
  }
  return reply;
}

uint32_t Shard::table_replicas_needed(const std::vector<int>& contributors) const {
  const JobConfig& job = job_.config();
  const uint32_t wanted = job.replicas_to_aggregate;
  const uint32_t total = job.total_replicas > 0 ? job.total_replicas : wanted;
  const uint32_t lost = job_.lost_workers(contributors);
  const uint32_t available = total > lost ? total - lost : 0;
  return std::max<uint32_t>(1, std::min(wanted, available));
}

void Shard::commit_table_step() {
  for (auto& [name, t] : tables_->tables) {
    TableSyncSlot& slot = t.sync;
    if (!slot.complete) continue;
    // The average over the workers that contributed (replicas_to_aggregate,
    // or fewer when workers have left), as for dense tensors.
    try {
      const uint64_t fresh =
          t.table->check(slot.ids, "sync step", EmbeddingTable::Creating::kByPush);
      // The pushes were charged for these rows; others may have taken the
      // room since (pulls into spare slots), so the budget is checked again.
      slot.new_rows = 0;
      if (fresh > 0) {
        check_memory(t.table->bytes_for_new_rows(fresh),
                     std::to_string(fresh) + " new rows of the step's pushes");
      }
      const float scale = 1.0f / static_cast<float>(slot.count);
      const std::optional<bool> within =
          slot.within_bound ? std::optional<bool>(true) : std::nullopt;
      // slot.ids holds each id once (slot.position): no search for repeats.
      if (!apply_table_update(*t.table, slot.ids, slot.sum, scale, fresh, within,
                              EmbeddingTable::Repeats::kNone))
        throw RequestError("the step's update would make a value or optimizer slot NaN or Inf");
    } catch (const Error& e) {
      // A dynamic table at its row limit (or psd at its memory budget) can
      // refuse the union of the workers' ids after each push alone passed,
      // and their summed gradients can overflow where each alone did not.
      spdlog::error("sync step {}: table '{}' not updated: {}", job_.global_step(), name, e.what());
    }
    slot.clear();
  }
}

void Shard::recheck_table_sync() {
  for (auto& [name, t] : tables_->tables) {
    TableSyncSlot& slot = t.sync;
    if (!slot.complete && slot.count > 0 &&
        slot.count >= table_replicas_needed(slot.contributors)) {
      slot.complete = true;
      ++complete_tensors_;
    }
  }
}

static_assert(kSketchRows == CountSketch::kRows && kMaxSketchWidth == CountSketch::kMaxWidth,
              "a checkpoint's count sketch is laid out as CountSketch's");

void Shard::snapshot_tables(ShardCheckpoint& c) const {
  for (const auto& [name, t] : tables_->tables) {
    TableCheckpoint tc;
    tc.spec = t.table->spec();
    tc.shard_index = t.table->shard();
    tc.num_shards = t.table->shards();
    tc.version = t.table->version();
    const uint32_t dim = t.table->dim();
    const uint64_t rows = t.table->rows();
    tc.ids.reserve(rows);
    tc.values.reserve(rows * dim);
    tc.slots.resize(t.table->optimizer().num_slots());
    for (auto& s : tc.slots) s.reserve(rows * dim);
    const bool expires = tc.spec.expire_after_steps != 0;
    if (expires) tc.ages.reserve(rows);
    t.table->for_each_row(
        [&](uint64_t id, const float* w, std::span<const float* const> slots, uint32_t age) {
          tc.ids.push_back(id);
          tc.values.insert(tc.values.end(), w, w + dim);
          for (std::size_t k = 0; k < slots.size(); ++k)
            tc.slots[k].insert(tc.slots[k].end(), slots[k], slots[k] + dim);
          if (expires) tc.ages.push_back(age);
        });
    if (const CountSketch* sketch = t.table->sketch()) {
      tc.sketch_key = sketch->key();
      tc.sketch_width = sketch->width();
      tc.sketch = sketch->counters();
    }
    c.tables.push_back(std::move(tc));
  }
}

void Shard::restore_tables(const ShardCheckpoint& c) {
  std::vector<ShardTableSpec> specs;
  for (const auto& t : c.tables) specs.push_back({t.spec, t.shard_index, t.num_shards});
  create_tables(specs, false);
  for (const auto& t : c.tables) {
    std::vector<std::span<const float>> slots;
    for (const auto& s : t.slots) slots.emplace_back(s);
    restore_rows(t.spec.name, t.ids, t.values, slots, t.version, t.ages);
    if (t.sketch_width != 0) {
      try {
        tables_->get(t.spec.name, "restore")
            .table->restore_sketch(t.sketch_key, t.sketch_width, t.sketch);
      } catch (const RequestError& e) {
        spdlog::warn("table '{}': its admission counts start again: {}", t.spec.name, e.what());
      }
    }
  }
}

void Shard::restore_rows(std::string_view table, std::span<const uint64_t> ids,
                         std::span<const float> values,
                         const std::vector<std::span<const float>>& slots, uint64_t version,
                         std::span<const uint32_t> ages) {
  ShardTable& t = tables_->get(table, "restoreRows");
  const uint32_t dim = t.table->dim();
  const std::string name(table);
  if (values.size() != ids.size() * dim) {
    throw RequestError("restoreRows: table '" + name + "' has dim " + std::to_string(dim) + ": " +
                       std::to_string(ids.size()) + " ids need " +
                       std::to_string(ids.size() * dim) + " floats, got " +
                       std::to_string(values.size()));
  }
  if (slots.size() != t.table->optimizer().num_slots()) {
    throw RequestError("restoreRows: table '" + name + "' has " +
                       std::to_string(t.table->optimizer().num_slots()) + " optimizer slots, got " +
                       std::to_string(slots.size()));
  }
  if (!all_finite(values))
    throw RequestError("restoreRows: table '" + name + "' has a NaN or Inf value");
  if (version > EmbeddingTable::kMaxVersion) {
    // LazyAdam corrects by the update count: one about to wrap would stop the table.
    throw RequestError("restoreRows: table '" + name + "': version " + std::to_string(version) +
                       " is over 2^62 updates");
  }
  for (uint32_t k = 0; k < slots.size(); ++k) {
    if (slots[k].size() != values.size())
      throw RequestError("restoreRows: a slot of table '" + name + "' has the wrong size");
    if (!all_finite(slots[k]))
      throw RequestError("restoreRows: table '" + name + "' has a NaN or Inf slot value");
    if (const char* violation = t.table->optimizer().slot_violation(k, slots[k]))
      throw RequestError("restoreRows: table '" + name + "': " + violation);
  }
  if (!ages.empty() && ages.size() != ids.size()) {
    throw RequestError("restoreRows: table '" + name + "': " + std::to_string(ids.size()) +
                       " ids, " + std::to_string(ages.size()) + " row ages");
  }
  const uint64_t fresh = t.table->check(ids, "restoreRows");
  if (fresh > 0) {
    check_memory(bytes_for_more_rows(t, fresh),
                 "restoreRows: " + std::to_string(fresh) + " new rows of table '" + name + "'");
  }
  std::vector<const float*> slot_data(slots.size());
  for (std::size_t k = 0; k < slots.size(); ++k) slot_data[k] = slots[k].data();
  t.table->put_rows(ids, values.data(), slot_data, ages);
  t.table->set_version(std::max(t.table->version(), version));
}

void Shard::tables_reached_step() {
  const int64_t now = job_.global_step();
  for (auto& [name, t] : tables_->tables) {
    if (const uint64_t dropped = t.table->advance_to_step(now); dropped > 0) {
      spdlog::debug("table '{}': {} rows expired at step {} (untouched for {} steps)", name,
                    dropped, now, t.table->spec().expire_after_steps);
    }
  }
}

void Shard::count_table_contributions(std::map<int, uint64_t>& given, bool& pending) const {
  for (const auto& [name, t] : tables_->tables) {
    pending = pending || t.sync.count > 0;
    for (int w : t.sync.contributors) ++given[w];
  }
}

}  // namespace ps
