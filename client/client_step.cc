// Client::push_and_step with table rows: one step's tensor gradients, row
// gradients and step report. The tensors go first (push_round, no report),
// then each table's requests; the report rides on the last request sent to
// each shard, or on a stepDone after them, so that a shard counts the step
// done only with all of this worker's gradients for it in.
#include <algorithm>
#include <limits>
#include <set>

#include "client/client_impl.h"
#include "client/row_plan.h"
#include "client/table_rows.h"
#include "common/finite.h"
#include "ps/client.h"

namespace ps {
namespace {

// One table's part of the step, planned and summed before anything is sent.
struct TablePart {
  std::string table;
  uint32_t dim = 0;
  std::shared_ptr<const RowPlan> plan;
  std::shared_ptr<PushGradients> sums;  // plan order, repeated ids summed
};

struct RowReply {
  PushStatus status = PushStatus::kApplied;
  int64_t step = 0;
  bool stop = false;
};

}  // namespace

PullResult Client::pull_with_rows(const std::vector<std::string>& names,
                                  const std::vector<std::span<float>>& out,
                                  const std::vector<RowsInto>& rows, int64_t min_step) {
  if (names.size() != out.size()) {
    throw ConfigError("pull_with_rows: " + std::to_string(names.size()) + " names but " +
                      std::to_string(out.size()) + " buffers");
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const uint64_t n = impl_->tensor_elements(names[i]);
    if (out[i].size() != n) {
      throw RequestError("pull_with_rows: buffer for '" + names[i] + "' holds " +
                         std::to_string(out[i].size()) + " floats, tensor has " +
                         std::to_string(n));
    }
  }
  const uint64_t rollbacks_at_call = rollbacks();
  std::vector<std::shared_ptr<Impl::RowPull>> tables;
  std::vector<std::span<float>> row_out;
  // In sync mode every shard is read (maybe for no rows), as push_and_step
  // sends to every shard: the step read is one every shard has reached.
  const bool sync = impl_->job_mode.load() == SyncMode::kSync;
  for (const RowsInto& r : rows) {
    const TableSpec spec = table_spec(r.table, "pull_with_rows");
    if (r.out.size() != r.ids.size() * spec.dim) {
      throw ConfigError("pull_with_rows: table '" + r.table + "' has dim " +
                        std::to_string(spec.dim) + ": " + std::to_string(r.ids.size()) +
                        " ids need " + std::to_string(r.ids.size() * spec.dim) +
                        " floats of output, got " + std::to_string(r.out.size()));
    }
    check_ids(spec, r.ids, "pull_with_rows");
    auto t = std::make_shared<Impl::RowPull>();
    t->plan =
        shared_row_plan(as_unsigned(r.ids), placement_of(spec, static_cast<uint32_t>(num_shards())),
                        ids_per_request(row_request_bytes(), spec.dim), sync);
    t->table = r.table;
    t->dim = spec.dim;
    t->out = r.out.data();
    t->steps.assign(t->plan->requests.size(), 0);
    t->rollbacks_at_call = rollbacks_at_call;
    t->aligned_by_caller = true;
    tables.push_back(std::move(t));
    row_out.push_back(r.out);
  }
  auto batches = impl_->plan(names);
  PullResult result;
  impl_->run<PullResult>(
      [this, batches = std::move(batches), out, tables, row_out, n = names.size(), min_step,
       rollbacks_at_call](Unanswered* unanswered) mutable {
        Impl& impl = *impl_;
        auto dense = kj::heap<Impl::PullState>();
        dense->unanswered = unanswered;
        for (const auto& t : tables) t->unanswered = unanswered;
        dense->batches = std::move(batches);
        dense->out = std::move(out);
        dense->steps.assign(dense->batches.size(), 0);
        dense->versions.resize(dense->batches.size());
        dense->from_shared.resize(dense->batches.size());
        dense->rollbacks_at_call = rollbacks_at_call;
        dense->aligned_by_caller = true;
        auto every = [](std::size_t count) {
          std::vector<std::size_t> all(count);
          for (std::size_t i = 0; i < count; ++i) all[i] = i;
          return all;
        };
        // Every request goes out in this turn of the loop, on the same connections.
        kj::Vector<kj::Promise<void>> calls;
        calls.add(impl.pull_round(*dense, every(dense->batches.size()), min_step, 0));
        for (const auto& t : tables)
          calls.add(impl.pull_row_requests(t, every(t->plan->requests.size()), min_step, 0));
        auto* raw = dense.get();
        return kj::joinPromises(calls.releaseAsArray())
            .then([&impl, raw, tables] { return impl.align_steps(*raw, tables, 0); })
            .then([dense = kj::mv(dense), tables, row_out, n]() mutable {
              PullResult r;
              r.versions.assign(n, std::numeric_limits<uint64_t>::max());
              r.step = std::numeric_limits<int64_t>::max();
              for (std::size_t b = 0; b < dense->batches.size(); ++b) {
                r.step = std::min(r.step, dense->steps[b]);
                for (std::size_t i = 0; i < dense->batches[b].parts.size(); ++i) {
                  auto& v = r.versions[dense->batches[b].parts[i].tensor];
                  v = std::min(v, dense->versions[b][i]);
                }
              }
              for (std::size_t t = 0; t < tables.size(); ++t) {
                for (int64_t s : tables[t]->steps) r.step = std::min(r.step, s);
                fill_repeats(*tables[t]->plan, tables[t]->dim, row_out[t].data());
              }
              if (r.step == std::numeric_limits<int64_t>::max()) r.step = 0;
              return r;
            });
      },
      "pull_with_rows: ", &result);
  return result;
}

kj::Promise<void> Client::Impl::align_steps(PullState& dense,
                                            std::vector<std::shared_ptr<RowPull>> tables,
                                            int round) {
  if (job_mode.load() != SyncMode::kSync) return kj::READY_NOW;
  int64_t newest = std::numeric_limits<int64_t>::min();
  for (int64_t s : dense.steps) newest = std::max(newest, s);
  for (const auto& t : tables)
    for (int64_t s : t->steps) newest = std::max(newest, s);
  // A shard restarted from an older checkpoint is read as it is (pull_round).
  auto behind = [&](uint32_t shard, int64_t step) {
    return step < newest && !shards[shard]->catching_up;
  };
  kj::Vector<kj::Promise<void>> calls;
  std::vector<std::size_t> which;
  for (std::size_t b = 0; b < dense.steps.size(); ++b)
    if (behind(dense.batches[b].shard, dense.steps[b])) which.push_back(b);
  bool any = !which.empty();
  if (any) calls.add(pull_round(dense, std::move(which), newest, round + 1));
  for (const auto& t : tables) {
    std::vector<std::size_t> late;
    for (std::size_t k = 0; k < t->steps.size(); ++k)
      if (behind(t->plan->requests[k].shard, t->steps[k])) late.push_back(k);
    if (late.empty()) continue;
    any = true;
    calls.add(pull_row_requests(t, std::move(late), newest, round + 1));
  }
  if (!any) {
    std::vector<std::pair<uint32_t, int64_t>> reads;
    for (std::size_t b = 0; b < dense.steps.size(); ++b)
      reads.emplace_back(static_cast<uint32_t>(dense.batches[b].shard), dense.steps[b]);
    for (const auto& t : tables)
      for (std::size_t k = 0; k < t->steps.size(); ++k)
        reads.emplace_back(t->plan->requests[k].shard, t->steps[k]);
    note_caught_up(reads);
    return kj::READY_NOW;
  }
  if (round >= 16) {
    throw RequestError(
        "shards kept moving to new steps; could not read the tensors and rows at one step");
  }
  return kj::joinPromises(calls.releaseAsArray())
      .then([this, &dense, tables = std::move(tables), round]() mutable {
        return align_steps(dense, std::move(tables), round + 1);
      });
}

PushResult Client::push_and_step(const std::vector<std::string>& names,
                                 const std::vector<std::span<const float>>& grads,
                                 const std::vector<RowGrads>& rows, int64_t step,
                                 int64_t done_step) {
  PushResult result;
  start_push_step(names, grads, rows, step, done_step, &result);
  return result;
}

std::future<PushResult> Client::push_and_step_async(std::vector<std::string> names,
                                                    std::vector<std::span<const float>> grads,
                                                    std::vector<RowGrads> rows, int64_t step,
                                                    int64_t done_step) {
  return start_push_step(std::move(names), std::move(grads), std::move(rows), step, done_step,
                         nullptr);
}

std::future<PushResult> Client::start_push_step(std::vector<std::string> names,
                                                std::vector<std::span<const float>> grads,
                                                std::vector<RowGrads> rows, int64_t step,
                                                int64_t done_step, PushResult* done) {
  if (rows.empty()) return start_push(std::move(names), std::move(grads), step, done, done_step);
  impl_->check_push("push_and_step", names, grads, done_step);
  if (!step_in_range(step)) {
    throw RequestError("push_and_step: step " + std::to_string(step) +
                       " is out of range [0, 2^62] (nothing was sent)");
  }
  const bool sync = impl_->job_mode.load() == SyncMode::kSync;
  const auto shards = static_cast<uint32_t>(num_shards());
  std::vector<TablePart> tables;
  std::set<std::string> seen;
  for (const RowGrads& r : rows) {
    // psd takes one push per worker, table and step: a second would be dropped.
    if (!seen.insert(r.table).second)
      throw ConfigError("push_and_step: table '" + r.table + "' given twice in one step");
    const TableSpec spec = table_spec(r.table, "push_and_step");
    if (r.grads.size() != r.ids.size() * spec.dim) {
      throw RequestError(
          "push_and_step: table '" + r.table + "' has dim " + std::to_string(spec.dim) + ": " +
          std::to_string(r.ids.size()) + " ids need " + std::to_string(r.ids.size() * spec.dim) +
          " gradient floats, got " + std::to_string(r.grads.size()) + " (nothing was sent)");
    }
    check_ids(spec, r.ids, "push_and_step");
    // Every shard gets each table's part (maybe empty) in one message in sync
    // mode, as push_rows sends it.
    TablePart part{r.table, spec.dim, nullptr, nullptr};
    part.plan = shared_row_plan(
        as_unsigned(r.ids), placement_of(spec, shards),
        ids_per_request(sync ? impl_->max_payload_bytes : row_request_bytes(), spec.dim), sync);
    if (sync && part.plan->requests.size() > shards) {
      throw ConfigError(
          "push_and_step: in sync mode each shard's part of a table goes as one "
          "message, and table '" +
          r.table + "' gets more than psd accepts in one (" +
          std::to_string(impl_->max_payload_bytes) +
          " bytes); raise psd --max_message_mb or push fewer ids per step (nothing "
          "was sent)");
    }
    part.sums = std::make_shared<PushGradients>(part.plan, r.grads, spec.dim);
    tables.push_back(std::move(part));
  }
  auto batches = impl_->plan(names);
  const uint32_t summed = impl_->summed_per_step();
  return impl_->run<PushResult>(
      [this, batches = std::move(batches), names = std::move(names), grads = std::move(grads),
       tables = std::move(tables), step, done_step, sync, summed](Unanswered* unanswered) mutable {
        Impl& impl = *impl_;
        // The step goes out as several requests: psd refusing one (NaN/Inf,
        // or a value whose sum would overflow) would leave the others
        // applied. Checked here whole, on what each shard would get.
        if (impl.options.check_split_pushes) {
          const float limit = gradient_limit(summed);
          auto refuses = [&](uint32_t shard) { return !impl.shards[shard]->allows_nonfinite; };
          for (const ShardBatch& batch : batches) {
            if (!refuses(batch.shard)) continue;
            for (const PartRef& ref : batch.parts) {
              const auto g = grads[ref.tensor].subspan(ref.part.offset, ref.part.count);
              if (!all_finite(g, limit))
                throw RequestError(gradient_refusal(names[ref.tensor], g, summed) +
                                   " (nothing was sent)");
            }
          }
          for (const TablePart& t : tables) {
            if (t.sums->all_within(limit)) continue;
            for (const RowRequest& r : t.plan->requests) {
              if (!refuses(r.shard) || t.sums->within(r, limit)) continue;
              std::vector<float> g(std::size_t(r.count) * t.dim);
              t.sums->write(r, g.data());
              throw RequestError(gradient_refusal(t.table, g, summed) + " (nothing was sent)");
            }
          }
        }
        const bool has_dense = !batches.empty();
        auto result = kj::heap<PushResult>();
        PushResult* res = result.get();
        res->row_status.assign(tables.size(), PushStatus::kApplied);
        res->step = std::numeric_limits<int64_t>::max();
        kj::Vector<kj::Promise<void>> calls;
        // The tensors first: their requests are on the wire before the rows'.
        calls.add(impl.push_round(std::move(batches), std::move(grads), names.size(), step, -1,
                                  unanswered)
                      .then([res, has_dense](PushResult&& dense) {
                        res->status = std::move(dense.status);
                        if (has_dense) res->step = std::min(res->step, dense.step);
                      }));
        // The last row request to each shard carries the report.
        std::vector<std::pair<std::size_t, std::size_t>> last(impl.shards.size(), {SIZE_MAX, 0});
        for (std::size_t t = 0; t < tables.size(); ++t) {
          for (std::size_t k = 0; k < tables[t].plan->requests.size(); ++k)
            last[tables[t].plan->requests[k].shard] = {t, k};
        }
        for (std::size_t t = 0; t < tables.size(); ++t) {
          auto part = std::make_shared<const TablePart>(tables[t]);
          const std::vector<uint32_t> parts = requests_per_shard(*part->plan, impl.shards.size());
          for (std::size_t k = 0; k < part->plan->requests.size(); ++k) {
            const RowRequest r = part->plan->requests[k];
            const int64_t reports = last[r.shard] == std::make_pair(t, k) ? done_step : int64_t{-1};
            const uint64_t id = impl.new_request_id();  // kept across retries: applied once
            auto send = [part, r, step, id, reports, sync, n = parts[r.shard]](
                            ShardConnection& c, int attempt) -> kj::Promise<RowReply> {
              if (attempt > 0 && c.rolled_back && sync && step > c.hello_step) {
                // The shard restarted from a step before this gradient's (see push_round).
                return RowReply{PushStatus::kStale, c.hello_step, false};
              }
              auto req = c.shard.pushRowsRequest();
              req.setTable(part->table);
              req.setIds(kj::arrayPtr(part->plan->ids.data() + r.first, r.count));
              req.setIdsDistinct(true);  // a plan names each id once, its gradients summed
              req.setStep(step);
              req.setRequestId(id);
              req.setDoneStep(reports);
              req.setParts(n);
              return Impl::send_row_grads(kj::mv(req), c, part->sums, r)
                  .then([&c](capnp::Response<wire::Shard::PushRowsResults>&& reply) {
                    const int64_t step = reply_step(c, reply.getStep());
                    c.last_step = std::max(c.last_step, step);
                    return RowReply{from_wire(reply.getStatus()), step, reply.getStop()};
                  });
            };
            calls.add(counted(unanswered, static_cast<int>(r.shard),
                              impl.retry->call_identified(static_cast<int>(r.shard), kj::mv(send)))
                          .then([res, t, r, reports](RowReply&& reply) {
                            res->row_status[t] = std::max(res->row_status[t], reply.status);
                            res->step = std::min(res->step, reply.step);
                            if (reports >= 0) {
                              if (r.shard == 0) res->global_step = reply.step;
                              res->stop = res->stop || reply.stop;
                            }
                          }));
          }
        }
        // Shards no row goes to: a stepDone, after their tensors' requests.
        for (std::size_t shard = 0; done_step >= 0 && shard < last.size(); ++shard) {
          if (last[shard].first != SIZE_MAX) continue;
          const uint64_t id = impl.new_request_id();
          auto send = [done_step, id](ShardConnection& c, int) {
            return send_step_done(c, done_step, id);
          };
          calls.add(counted(unanswered, static_cast<int>(shard),
                            impl.retry->call_identified(static_cast<int>(shard), kj::mv(send)))
                        .then([shard, res](capnp::Response<wire::Shard::StepDoneResults>&& reply) {
                          if (shard == 0) res->global_step = reply.getGlobalStep();
                          res->stop = res->stop || reply.getStop();
                        }));
        }
        return kj::joinPromises(calls.releaseAsArray())
            .then([result = kj::mv(result), tables = std::move(tables)]() mutable {
              if (result->step == std::numeric_limits<int64_t>::max()) result->step = 0;
              return std::move(*result);
            });
      },
      "push_and_step: ", done);
}

}  // namespace ps
