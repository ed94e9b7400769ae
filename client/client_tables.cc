// Client: embedding tables. A batch of ids is deduplicated and split by
// shard (client/row_plan.h); its requests go to all shards at once, and the
// rows come back into the caller's buffer in the caller's order.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>

#include <spdlog/spdlog.h>

#include "client/client_impl.h"
#include "client/row_plan.h"
#include "client/table_rows.h"
#include "common/embedding_wire.h"
#include "common/finite.h"
#include "common/tensor_name.h"
#include "ps/client.h"

namespace ps {
namespace {

struct Nothing {};

}  // namespace

void Client::declare_tables(const std::vector<TableSpec>& tables) {
  // psd's rule for names: a table the client knows has a name psd takes, so
  // a request's name is never one that reads as another (Text stops at NUL).
  for (const auto& t : tables) check_name(t.name, "declare_tables: table");
  std::lock_guard lock(impl_->placement_mutex);
  for (const auto& t : tables) impl_->tables[t.name] = t;
}

void Client::create_tables(const std::vector<TableSpec>& tables) {
  std::set<std::string> names;
  for (const auto& t : tables) {
    check_name(t.name, "create_tables: table");
    if (!names.insert(t.name).second)
      throw ConfigError("create_tables: table '" + t.name + "' given twice");
  }
  const auto shards = static_cast<uint32_t>(num_shards());
  auto specs = std::make_shared<const std::vector<TableSpec>>(tables);
  // Every shard checks every table first: one refusal creates nothing anywhere.
  for (bool validate : {true, false}) {
    impl_->every_shard<Nothing>(
        [specs, shards, validate](ShardConnection& c) {
          auto req = c.shard.createTablesRequest();
          req.setValidateOnly(validate);
          auto list = req.initTables(static_cast<unsigned>(specs->size()));
          for (unsigned i = 0; i < specs->size(); ++i) {
            to_wire((*specs)[i], static_cast<uint32_t>(c.index), shards, list[i]);
          }
          return req.send();
        },
        [this, validate](Nothing&, int shard, auto&) {
          // Loop thread: a restart of this shard that finds it empty lost the model.
          if (!validate) impl_->shards[static_cast<std::size_t>(shard)]->holds_model = true;
        },
        "createTables: ");
  }
  declare_tables(tables);
}

// Row requests are cut at ClientOptions::max_request_bytes (not at the
// dense part size: a row is never split).
uint64_t Client::row_request_bytes() const {
  return std::min<uint64_t>(impl_->options.max_request_bytes, impl_->max_payload_bytes);
}

TableSpec Client::table_spec(const std::string& table, const char* what) const {
  std::lock_guard lock(impl_->placement_mutex);
  auto it = impl_->tables.find(table);
  if (it == impl_->tables.end()) {
    throw ConfigError(std::string(what) + ": no table '" + table +
                      "' (create_tables or declare_tables first)");
  }
  return it->second;
}

namespace {

// Gradients of at least this many bytes go out without a copy.
constexpr std::size_t kMinExternalBytes = 4096;
// A large pull goes in parts of this many requests' ids (start_pull_rows).
constexpr std::size_t kRequestsPerPullPart = 2;
// A reply of rows gathered into shared memory at least this large takes psd
// longer to gather than the loop polls for.
constexpr uint64_t kSleepForRowBytes = 256 * 1024;

}  // namespace

// Sends the requests `which` of st's plan, waiting for min_step. In sync mode
// every shard's rows must come from one step, as a dense pull's do
// (client_transfer.cc): a request read before the newest step another
// returned is sent again for that step (a step closed between the two reads).
kj::Promise<void> Client::Impl::pull_row_requests(std::shared_ptr<RowPull> st,
                                                  std::vector<std::size_t> which, int64_t min_step,
                                                  int round) {
  Impl& impl = *this;
  kj::Vector<kj::Promise<void>> calls;
  for (std::size_t k : which) {
    const RowRequest r = st->plan->requests[k];
    auto send = [&impl, st, r, min_step](ShardConnection& c, int attempt) {
      auto req = c.shard.pullRowsRequest();
      req.setTable(st->table);
      req.setIds(kj::arrayPtr(st->plan->ids.data() + r.first, r.count));
      req.setLookup(st->lookup);
      // A shard back from a restart at an older step may never reach the
      // step asked for: read what it has (reconnector.h), as pull_round does.
      const bool news = attempt > 0 || st->rollbacks_at_call != impl.rollbacks_now();
      req.setMinStep(news && c.rolled_back ? std::min(min_step, c.hello_step) : min_step);
      // Large parts come through shared memory where the connection has
      // some: scattered from there once the reply is in, before the block
      // goes back to the arena.
      const uint64_t bytes = uint64_t(r.count) * st->dim * sizeof(float);
      kj::Own<SharedBlocks> blocks;
      if (c.arena) blocks = kj::heap<SharedBlocks>(c.arena);
      const auto offset = blocks ? take_shared(*blocks, bytes) : std::nullopt;
      if (offset) set_slice(req.initInto(), *c.arena, *offset, bytes);
      // Such a reply comes once psd has gathered every row: a large one is
      // slept for, not polled for on a core the client's other work needs
      // (docs/embedding.md, "Same host").
      kj::Own<ClientLoop::PollingHold> hold;
      if (offset && bytes >= kSleepForRowBytes) hold = kj::heap<ClientLoop::PollingHold>(impl.loop);
      return until_answered(
          req.send()
              .attach(kj::mv(hold))
              .then([&c, arena = c.arena, st, r,
                     offset](capnp::Response<wire::Shard::PullRowsResults>&& reply) {
                reply_step(c, reply.getStep());
                if (!reply.getInShared()) return kj::mv(reply);
                if (!offset || reply.getRows().size() != 0) {
                  throw RequestError(shard_name(c) +
                                     " answered rows in shared memory it was not given");
                }
                scatter_request(*st->plan, r, reinterpret_cast<const float*>(arena->at(*offset)),
                                st->dim, st->out);
                return kj::mv(reply);
              }),
          kj::mv(blocks));
    };
    calls.add(counted(st->unanswered, static_cast<int>(r.shard),
                      impl.retry->call(static_cast<int>(r.shard), kj::mv(send)))
                  .then([&impl, st, r, k](capnp::Response<wire::Shard::PullRowsResults>&& reply) {
                    ShardConnection& c = *impl.shards[r.shard];
                    if (reply.getInShared()) {
                      st->steps[k] = reply.getStep();
                      c.last_step = std::max(c.last_step, reply.getStep());
                      return;
                    }
                    auto data = reply.getRows();
                    const std::size_t want = std::size_t(r.count) * st->dim * sizeof(float);
                    if (data.size() != want) {
                      throw RequestError(shard_name(c) + " replied " + std::to_string(data.size()) +
                                         " bytes for " + std::to_string(r.count) +
                                         " rows of table '" + st->table + "', expected " +
                                         std::to_string(want));
                    }
                    const float* rows = reinterpret_cast<const float*>(data.begin());
                    std::vector<float> aligned;
                    if (reinterpret_cast<uintptr_t>(data.begin()) % alignof(float) != 0) {
                      aligned.resize(std::size_t(r.count) * st->dim);
                      std::memcpy(aligned.data(), data.begin(), want);
                      rows = aligned.data();
                    }
                    scatter_request(*st->plan, r, rows, st->dim, st->out);
                    st->steps[k] = reply.getStep();
                    c.last_step = std::max(c.last_step, reply.getStep());
                  }));
  }
  return kj::joinPromises(calls.releaseAsArray()).then([&impl, st, round]() -> kj::Promise<void> {
    if (impl.job_mode.load() != SyncMode::kSync || st->steps.empty() || st->aligned_by_caller)
      return kj::READY_NOW;
    const int64_t newest = *std::max_element(st->steps.begin(), st->steps.end());
    std::vector<std::size_t> behind;
    for (std::size_t k = 0; k < st->steps.size(); ++k) {
      // A shard restarted from an older checkpoint is read as it is (see pull_round).
      if (st->steps[k] < newest && !impl.shards[st->plan->requests[k].shard]->catching_up)
        behind.push_back(k);
    }
    if (behind.empty()) {
      std::vector<std::pair<uint32_t, int64_t>> reads;
      for (std::size_t k = 0; k < st->steps.size(); ++k)
        reads.emplace_back(st->plan->requests[k].shard, st->steps[k]);
      impl.note_caught_up(reads);
      return kj::READY_NOW;
    }
    if (round >= 16) {
      throw RequestError(std::string(st->lookup ? "lookup_rows" : "pull_rows") +
                         ": shards kept moving to new steps; could not read table '" + st->table +
                         "' at one step");
    }
    return impl.pull_row_requests(st, std::move(behind), newest, round + 1);
  });
}

std::future<int64_t> Client::start_pull_rows(const std::string& table, std::span<const int64_t> ids,
                                             std::span<float> out, int64_t min_step, bool lookup,
                                             int64_t* done) {
  const std::string what = lookup ? "lookup_rows" : "pull_rows";
  const TableSpec spec = table_spec(table, what.c_str());
  const uint32_t dim = spec.dim;
  if (out.size() != ids.size() * dim) {
    throw ConfigError(what + ": table '" + table + "' has dim " + std::to_string(dim) + ": " +
                      std::to_string(ids.size()) + " ids need " + std::to_string(ids.size() * dim) +
                      " floats of output, got " + std::to_string(out.size()));
  }
  check_ids(spec, ids, what.c_str());
  // A large pull plans its later parts from `ids` while earlier rows land in
  // `out`: rows written over the ids would be ids never checked.
  const auto id_at = reinterpret_cast<uintptr_t>(ids.data()),
             out_at = reinterpret_cast<uintptr_t>(out.data());
  if (!ids.empty() && !out.empty() && id_at < out_at + out.size_bytes() &&
      out_at < id_at + ids.size_bytes()) {
    throw ConfigError(what + ": out for table '" + table +
                      "' shares memory with the ids: the rows would overwrite the ids being read "
                      "(pass separate buffers; nothing was sent)");
  }
  const uint32_t per = ids_per_request(row_request_bytes(), dim);
  const uint64_t rollbacks_at_call = rollbacks();
  // The pull of ids[first, first + count) into out's rows from `first` on:
  // planned here, then sent, scattered and completed by the loop.
  auto pull_of = [&](std::size_t first, std::size_t count) {
    // A batch of no ids still asks every shard: its step (min_step waited
    // for) is what the caller pushes at next.
    auto plan = shared_row_plan(as_unsigned(ids.subspan(first, count)),
                                placement_of(spec, num_shards()), per, ids.empty());
    float* to = out.data() + first * dim;
    return [this, plan, table, dim, min_step, to, rollbacks_at_call,
            lookup](Unanswered* unanswered) {
      auto st = std::make_shared<Impl::RowPull>();
      st->lookup = lookup;
      st->rollbacks_at_call = rollbacks_at_call;
      st->unanswered = unanswered;
      st->plan = plan;
      st->table = table;
      st->dim = dim;
      st->out = to;
      st->steps.assign(plan->requests.size(), 0);
      std::vector<std::size_t> all(plan->requests.size());
      for (std::size_t k = 0; k < all.size(); ++k) all[k] = k;
      return impl_->pull_row_requests(st, std::move(all), min_step, 0).then([st] {
        fill_repeats(*st->plan, st->dim, st->out);
        return st->steps.empty() ? int64_t{0}
                                 : *std::min_element(st->steps.begin(), st->steps.end());
      });
    };
  };
  // A large blocking pull outside sync mode goes in parts of two requests'
  // ids, each sent as soon as it is planned (the loop's helper thread carries
  // it), so that planning the next part overlaps the shards' work on those
  // before it. A part deduplicates its own ids: an id in two parts is
  // fetched twice. Sync mode reads every row at one step, so one plan.
  const std::size_t part = std::size_t(per) * kRequestsPerPullPart;
  if (done != nullptr && impl_->job_mode.load() != SyncMode::kSync && ids.size() > 2 * part) {
    // The parts are given up together on options.interrupted, as call()
    // gives a call up: each is destroyed on the loop (kj::Canceler) before
    // this throws. The canceler is the loop's.
    auto canceler = std::make_unique<kj::Canceler>();
    std::vector<std::future<int64_t>> parts;
    for (std::size_t first = 0; first < ids.size(); first += part)
      parts.push_back(
          impl_->submit<int64_t>([op = pull_of(first, std::min(part, ids.size() - first)),
                                  c = canceler.get()] { return c->wrap(op(nullptr)); },
                                 what + ": "));
    // Waited for in slices of kAskInterruptedEvery on this thread: options.interrupted
    // is asked between them, and a wait of 5 s says so (then every 10 s).
    bool interrupted = false;
    const auto start = std::chrono::steady_clock::now();
    auto next_line = start + std::chrono::seconds(5);
    for (auto& p : parts) {
      while (!interrupted &&
             p.wait_for(Impl::kAskInterruptedEvery) != std::future_status::ready) {
        if (impl_->options.interrupted) interrupted = impl_->options.interrupted();
        const auto now = std::chrono::steady_clock::now();
        if (now < next_line) continue;
        next_line += std::chrono::seconds(10);
        const auto pending = std::count_if(parts.begin(), parts.end(), [](auto& f) {
          return f.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
        });
        spdlog::info("{}for psd's answers to {} of {} parts of {} ids",
                     waiting_prefix(what + ": ",
                                    std::chrono::round<std::chrono::seconds>(now - start).count(),
                                    impl_->options.call_timeout),
                     pending, parts.size(), ids.size());
      }
    }
    impl_->loop.run([&canceler, interrupted] {
      if (interrupted) canceler->cancel("interrupted");
      canceler = nullptr;
    });
    if (interrupted) {
      throw InterruptedError(what +
                             ": interrupted while waiting for psd's answer; the call was given up");
    }
    // Every part is waited for, failed or not: none may write into `out`
    // after this returns.
    int64_t step = std::numeric_limits<int64_t>::max();
    std::exception_ptr error;
    for (auto& p : parts) {
      try {
        step = std::min(step, p.get());
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    *done = step;
    return {};
  }
  return impl_->run<int64_t>(pull_of(0, ids.size()), what + ": ", done);
}

int64_t Client::pull_rows(const std::string& table, std::span<const int64_t> ids,
                          std::span<float> out, int64_t min_step) {
  int64_t step = 0;
  start_pull_rows(table, ids, out, min_step, false, &step);
  return step;
}

std::future<int64_t> Client::pull_rows_async(std::string table, std::span<const int64_t> ids,
                                             std::span<float> out, int64_t min_step) {
  return start_pull_rows(table, ids, out, min_step, false, nullptr);
}

int64_t Client::lookup_rows(const std::string& table, std::span<const int64_t> ids,
                            std::span<float> out, int64_t min_step) {
  int64_t step = 0;
  start_pull_rows(table, ids, out, min_step, true, &step);
  return step;
}

std::future<int64_t> Client::lookup_rows_async(std::string table, std::span<const int64_t> ids,
                                               std::span<float> out, int64_t min_step) {
  return start_pull_rows(table, ids, out, min_step, true, nullptr);
}

std::future<PushStatus> Client::start_push_rows(const std::string& table,
                                                std::span<const int64_t> ids,
                                                std::span<const float> grads, int64_t step,
                                                PushStatus* done) {
  const TableSpec spec = table_spec(table, "push_rows");
  const uint32_t dim = spec.dim;
  if (grads.size() != ids.size() * dim) {
    throw RequestError("push_rows: table '" + table + "' has dim " + std::to_string(dim) + ": " +
                       std::to_string(ids.size()) + " ids need " +
                       std::to_string(ids.size() * dim) + " gradient floats, got " +
                       std::to_string(grads.size()) + " (nothing was sent)");
  }
  if (!step_in_range(step)) {
    throw RequestError("push_rows: step " + std::to_string(step) +
                       " is out of range [0, 2^62] (nothing was sent)");
  }
  check_ids(spec, ids, "push_rows");
  const bool sync = impl_->job_mode.load() == SyncMode::kSync;
  // Sync mode counts one push per worker, table and step on each shard: its
  // part for a shard goes as one message, however large.
  auto plan = shared_row_plan(
      as_unsigned(ids), placement_of(spec, num_shards()),
      ids_per_request(sync ? impl_->max_payload_bytes : row_request_bytes(), dim), sync);
  if (sync && plan->requests.size() > static_cast<std::size_t>(num_shards())) {
    throw ConfigError(
        "push_rows: in sync mode each shard's part of a push goes as one message, and table '" +
        table + "' gets more than psd accepts in one (" + std::to_string(impl_->max_payload_bytes) +
        " bytes); raise psd --max_message_mb or push fewer ids per step (nothing was sent)");
  }
  const uint32_t summed = impl_->summed_per_step();
  auto sums = std::make_shared<PushGradients>(plan, grads, dim);
  return impl_->run<PushStatus>(
      [this, plan, sums, table, step, grads, summed](Unanswered* unanswered) {
        // psd refuses NaN/Inf per request; split over several, only a check
        // here keeps a bad gradient from being half applied (skipped for
        // shards run with --allow_nonfinite, as a dense push's). What is
        // checked is what psd gets: the sums of repeated ids (two finite
        // gradients can sum to Inf).
        const float limit = gradient_limit(summed);
        if (plan->requests.size() > 1 && impl_->options.check_split_pushes &&
            !sums->all_within(limit)) {
          for (const RowRequest& r : plan->requests) {
            const ShardConnection* shard = impl_->shards[r.shard].get();
            if (shard != nullptr && shard->allows_nonfinite) continue;
            if (sums->within(r, limit)) continue;
            if (!all_finite(grads, limit))
              throw RequestError(gradient_refusal(table, grads, summed) + " (nothing was sent)");
            throw RequestError("the gradients of an id that table '" + table +
                               "' gets more than once in the batch sum to Inf or past the limit "
                               "psd accepts (refused, nothing was sent)");
          }
        }
        auto worst = std::make_shared<PushStatus>(PushStatus::kApplied);
        kj::Vector<kj::Promise<void>> calls;
        const std::vector<uint32_t> parts = requests_per_shard(*plan, impl_->shards.size());
        for (const RowRequest& r : plan->requests) {
          const uint64_t id = impl_->new_request_id();  // kept across retries: applied once
          auto send = [plan, sums, r, table, step, id, n = parts[r.shard]](ShardConnection& c,
                                                                           int) {
            auto req = c.shard.pushRowsRequest(
                capnp::MessageSize{uint64_t(r.count) + table.size() / 8 + 32, 0});
            req.setTable(table);
            req.setIds(kj::arrayPtr(plan->ids.data() + r.first, r.count));
            req.setIdsDistinct(true);  // a plan names each id once, its gradients summed
            req.setStep(step);
            req.setRequestId(id);
            req.setParts(n);
            return Impl::send_row_grads(kj::mv(req), c, sums, r);
          };
          calls.add(counted(unanswered, static_cast<int>(r.shard),
                            impl_->retry->call_identified(static_cast<int>(r.shard), kj::mv(send)))
                        .then([worst](capnp::Response<wire::Shard::PushRowsResults>&& reply) {
                          *worst = std::max(*worst, from_wire(reply.getStatus()));
                        }));
        }
        return kj::joinPromises(calls.releaseAsArray()).then([plan, sums, worst] {
          return *worst;
        });
      },
      "push_rows: ", done);
}

PushStatus Client::push_rows(const std::string& table, std::span<const int64_t> ids,
                             std::span<const float> grads, int64_t step) {
  PushStatus status = PushStatus::kApplied;
  start_push_rows(table, ids, grads, step, &status);
  return status;
}

std::future<PushStatus> Client::push_rows_async(std::string table, std::span<const int64_t> ids,
                                                std::span<const float> grads, int64_t step) {
  return start_push_rows(table, ids, grads, step, nullptr);
}

kj::Promise<capnp::Response<wire::Shard::PushRowsResults>> Client::Impl::send_row_grads(
    capnp::Request<wire::Shard::PushRowsParams, wire::Shard::PushRowsResults> req,
    ShardConnection& c, std::shared_ptr<PushGradients> g, const RowRequest& r) {
  const std::size_t size = std::size_t(r.count) * g->dim() * sizeof(float);
  kj::Own<SharedBlocks> blocks;
  if (c.arena) blocks = kj::heap<SharedBlocks>(c.arena);
  if (auto offset = blocks ? take_shared(*blocks, size) : std::nullopt) {
    // Written into the connection's shared memory, held until psd answers.
    g->write(r, reinterpret_cast<float*>(blocks->arena().at(*offset)));
    set_slice(req.initSharedGrads(), blocks->arena(), *offset, size);
    return until_answered(req.send(), kj::mv(blocks));
  }
  auto bytes = as_data(g->rows(r));
  if (c.messages && bytes.size() >= kMinExternalBytes &&
      reinterpret_cast<uintptr_t>(bytes.begin()) % sizeof(capnp::word) == 0 &&
      bytes.size() % sizeof(capnp::word) == 0) {
    // Sent from where the rows lie without a copy, as a segment of its
    // own; the stream keeps them until written (a retry's message
    // included). Small ones are copied: a segment costs more.
    req.adoptGrads(capnp::Orphanage::getForMessageContaining(
                       static_cast<wire::Shard::PushRowsParams::Builder>(req))
                       .referenceExternalData(bytes));
    if (g->in_callers_buffer()) {
      return cut_if_abandoned(until_answered(req.send(), kj::mv(blocks)),
                              c.messages->connection().weak());
    }
    c.messages->connection().hold_until_sent(bytes.begin(), std::move(g));
  } else {
    req.setGrads(bytes);
  }
  return until_answered(req.send(), kj::mv(blocks));
}

std::vector<Client::TableInfo> Client::list_tables() {
  struct Collected {
    std::map<std::string, TableInfo> tables;
  };
  const int shards = num_shards();
  auto collected = impl_->every_shard<Collected>(
      [](ShardConnection& s) { return s.shard.listTablesRequest().send(); },
      [this, shards](Collected& out, int shard,
                     capnp::Response<wire::Shard::ListTablesResults>& reply) {
        check_reply_list(impl_->shard_name_at(shard), "tables", reply.getTables());
        for (auto t : reply.getTables()) {
          TableInfo& info = out.tables[t.getName()];
          info.name = t.getName();
          info.dim = t.getDim();
          info.dynamic = t.getDynamic();
          info.rows = info.dynamic ? info.rows + t.getRowsHere() : t.getRows();
          info.bytes += t.getBytes();
          info.evictions += t.getEvictions();
          info.ids_filtered += t.getIdsFiltered();
          info.rows_expired += t.getRowsExpired();
          info.rows_per_shard.resize(shards);
          info.rows_per_shard[shard] = t.getRowsHere();
        }
      },
      "listTables: ");
  std::vector<TableInfo> out;
  for (auto& [name, info] : collected.tables) out.push_back(std::move(info));
  return out;
}

void Client::restore_rows(const std::string& table, std::span<const int64_t> ids,
                          std::span<const float> values,
                          const std::vector<std::vector<float>>& slots, uint64_t version,
                          std::span<const uint32_t> ages) {
  const TableSpec spec = table_spec(table, "restore_rows");
  const uint32_t dim = spec.dim;
  if (values.size() != ids.size() * dim) {
    throw ConfigError("restore_rows: table '" + table + "': " + std::to_string(ids.size()) +
                      " ids need " + std::to_string(ids.size() * dim) + " values, got " +
                      std::to_string(values.size()));
  }
  for (const auto& s : slots) {
    if (s.size() != values.size())
      throw ConfigError("restore_rows: a slot of table '" + table + "' has the wrong size");
  }
  if (!ages.empty() && ages.size() != ids.size()) {
    throw ConfigError("restore_rows: table '" + table + "': " + std::to_string(ids.size()) +
                      " ids, " + std::to_string(ages.size()) + " row ages");
  }
  check_ids(spec, ids, "restore_rows");
  check_restore_fits(spec, ids, static_cast<uint32_t>(num_shards()), "restore_rows");
  // Values and slots travel together: a request's ids get 1 + slots rows each.
  const uint32_t per = ids_per_request(row_request_bytes() / (1 + slots.size()), dim);
  auto plan = shared_row_plan(as_unsigned(ids), placement_of(spec, num_shards()), per, false);
  if (plan->has_duplicates)
    throw ConfigError("restore_rows: table '" + table + "': an id is given twice");
  // Each component in plan order (shard by shard).
  auto parts = std::make_shared<std::vector<std::vector<float>>>(1 + slots.size());
  for (std::size_t k = 0; k < parts->size(); ++k) {
    (*parts)[k].resize(values.size());
    gather_gradients(*plan, k == 0 ? values.data() : slots[k - 1].data(), dim, (*parts)[k].data());
  }
  auto plan_ages = std::make_shared<std::vector<uint32_t>>();  // in plan order, as the parts
  if (!ages.empty()) {
    plan_ages->resize(plan->first.size());
    for (std::size_t p = 0; p < plan->first.size(); ++p) (*plan_ages)[p] = ages[plan->first[p]];
  }
  impl_
      ->submit<Nothing>(
          [this, plan, parts, plan_ages, table, dim, version]() {
            kj::Vector<kj::Promise<void>> calls;
            // Every shard takes the version, those that get no rows too: a
            // row created there later is updated as the table's next
            // update (LazyAdam's bias correction counts them), not its first.
            std::vector<RowRequest> requests = plan->requests;
            std::vector<bool> has_rows(impl_->shards.size());
            for (const RowRequest& r : requests) has_rows[r.shard] = true;
            for (uint32_t s = 0; s < has_rows.size(); ++s) {
              if (!has_rows[s]) requests.push_back(RowRequest{.shard = s, .first = 0, .count = 0});
            }
            for (const RowRequest& r : requests) {
              auto send = [plan, parts, plan_ages, r, table, dim, version](ShardConnection& c,
                                                                           int) {
                auto req = c.shard.restoreRowsRequest();
                req.setTable(table);
                req.setIds(kj::arrayPtr(plan->ids.data() + r.first, r.count));
                auto slice = [&](const std::vector<float>& v) {
                  return as_data(std::span<const float>(v.data() + std::size_t(r.first) * dim,
                                                        std::size_t(r.count) * dim));
                };
                req.setValues(slice((*parts)[0]));
                auto list = req.initSlots(static_cast<unsigned>(parts->size() - 1));
                for (unsigned k = 1; k < parts->size(); ++k) list.set(k - 1, slice((*parts)[k]));
                req.setVersion(version);
                if (!plan_ages->empty())
                  req.setAges(kj::arrayPtr(plan_ages->data() + r.first, r.count));
                return req.send().ignoreResult();
              };
              calls.add(impl_->retry->call(static_cast<int>(r.shard), kj::mv(send)));
            }
            return kj::joinPromises(calls.releaseAsArray()).then([plan, parts, plan_ages] {
              return Nothing{};
            });
          },
          "restoreRows: ")
      .get();
}

}  // namespace ps
