// libFuzzer target over psd's request handling: the input is an operation
// byte, a caller byte and a serialized Cap'n Proto message, read (as psd's
// RPC layer would) with a tight traversal limit and handed to the Shard
// handler as its params. Checks, besides the sanitizers' own: a handler that
// refuses a request (throws) has changed nothing, and whatever the request,
// the shard stores no NaN or Inf and no name with a control character
// (shard_invariants.h; a tensor with SGD at learning rate 1e38 is there to
// be pushed past FLT_MAX). Embedding tables too: createTables, pullRows,
// pushRows, listTables and restoreRows, over a fixed Adagrad table, a
// dynamic FTRL table at a small row limit (evicting), and a fixed SGD table
// at learning rate 1e38 next to FLT_MAX.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "server/shard.h"
#include "server/shard_wire.h"
#include "fuzz/shard_env.h"
#include "fuzz/shard_invariants.h"
#include "common/embedding_wire.h"
#include "common/wire_convert.h"

namespace {

// Everything a refused request must leave as it was.
struct Digest {
  uint64_t tensors, bytes, versions, pushes, creates, steps_applied;
  uint64_t tables, table_rows, table_rows_pushed;
  int64_t step;
  bool ready, configured, finished;
  float checksum;
  bool operator==(const Digest&) const = default;
};

Digest digest(ps::Shard& shard) {
  Digest d{};
  for (const ps::TableReport& t : shard.list_tables()) {
    d.tables += 1;
    d.table_rows += t.rows_here;
    d.versions += t.version;
    d.table_rows_pushed += t.rows_pushed;
  }
  for (const ps::TableCheckpoint& t : ps::fuzz::table_rows(shard)) {
    for (float x : t.values) d.checksum += x;
    for (const auto& slot : t.slots)
      for (float x : slot) d.checksum += x;
  }
  d.tensors = shard.store().count();
  d.bytes = shard.store().bytes();
  for (ps::StoredTensor* t : shard.store().all()) {
    d.versions += t->version();
    std::vector<float> v(t->size());
    t->read(v);
    for (float x : v) d.checksum += x;
  }
  d.pushes = shard.counters().pushes;
  d.creates = shard.counters().creates;
  d.steps_applied = shard.counters().steps_applied;
  d.step = shard.job().global_step();
  d.ready = shard.job().ready();
  d.configured = shard.job().configured();
  d.finished = shard.job().finished();
  return d;
}

void seed(ps::Shard& shard, bool sync) {
  capnp::MallocMessageBuilder m;
  auto params = m.initRoot<ps::wire::Shard::CreateParams>();
  auto specs = params.initSpecs(4);
  ps::to_wire(
      ps::TensorSpec{.name = "w", .shape = {4}, .optimizer = ps::OptimizerConfig::adam(0.1f)},
      specs[0]);
  ps::to_wire(
      ps::TensorSpec{.name = "v", .shape = {2, 3}, .optimizer = ps::OptimizerConfig::sgd(0.5f)},
      specs[1]);
  ps::to_wire(ps::TensorSpec{.name = "p/part_1", .shape = {5}}, specs[2]);
  auto part = specs[2].initPart();
  part.setFullName("p");
  part.initFullShape(1).set(0, 10);
  part.setOffset(5);
  part.setIndex(1);
  part.setCount(2);
  ps::to_wire(ps::TensorSpec{.name = "big",
                             .shape = {2},
                             .optimizer = ps::OptimizerConfig::sgd(1e38f),
                             .init = ps::InitConfig::constant(3e38f)},
              specs[3]);
  ps::CreateReply reply;
  shard.create(ps::create_from_wire(params.asReader()), reply);
  const std::vector<ps::ShardTableSpec> tables = {
      {{.name = "emb",
        .dim = 4,
        .rows = 16,
        .optimizer = ps::RowOptimizerConfig::adagrad(0.5f),
        .init = ps::InitConfig::uniform(-1, 1, 7)}},
      {{.name = "dyn",
        .dim = 2,
        .dynamic = true,
        .placement = ps::TablePlacement::kHash,
        .optimizer = ps::RowOptimizerConfig::ftrl(0.5f, 0.01f, 0.1f),
        .row_limit = 8,
        .on_limit = ps::OnRowLimit::kEvictLru}},
      {{.name = "hot",
        .dim = 2,
        .rows = 4,
        .optimizer = ps::RowOptimizerConfig::sgd(1e38f),
        .init = ps::InitConfig::constant(3e38f)}},
      // Rows that expire at the next step, and are evicted at a limit too.
      {{.name = "exp",
        .dim = 2,
        .dynamic = true,
        .placement = ps::TablePlacement::kHash,
        .optimizer = ps::RowOptimizerConfig::adagrad(0.5f),
        .row_limit = 8,
        .on_limit = ps::OnRowLimit::kEvictLru,
        .min_count = 2,
        .count_sketch_width = 64,
        .expire_after_steps = 1}}};
  shard.create_tables(tables, false);
  if (sync) {
    capnp::MallocMessageBuilder j;
    auto job = j.initRoot<ps::wire::JobConfig>();
    job.setMode(ps::wire::SyncMode::SYNC);
    job.setReplicasToAggregate(2);
    job.setTotalReplicas(3);
    shard.init_job(ps::job_from_wire(job.asReader()));
    shard.job().set_ready();
    shard.hello({.worker_index = 0, .is_chief = true, .peer = "fuzz"});
    shard.hello({.worker_index = 1, .is_chief = false, .peer = "fuzz"});
  }
}

// A pull's reply in a message of its own, copied (no stream).
class MessagePullReply final : public ps::WirePullReply {
 public:
  explicit MessagePullReply(capnp::MessageBuilder& message)
      : WirePullReply(0, nullptr), message_(message) {}

 private:
  ps::wire::Shard::PullResults::Builder results(capnp::MessageSize) override {
    return message_.initRoot<ps::wire::Shard::PullResults>();
  }
  capnp::MessageBuilder& message_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 + sizeof(capnp::word)) return 0;
  const uint8_t op = data[0] % 13;
  const uint8_t who = data[1];
  const bool sync = who & 0x80;
  // Aligned copy, as the RPC layer's buffers are.
  std::vector<uint64_t> words((size - 2) / sizeof(capnp::word));  // capnp::word is not movable
  std::memcpy(words.data(), data + 2, words.size() * sizeof(capnp::word));

  ps::ShardOptions options;
  options.limits.max_tensor_bytes = 1 << 20;
  options.limits.max_total_bytes = 8 << 20;
  options.limits.max_tensors = 64;
  options.inline_bytes = 1 << 30;
  ps::Shard shard(options, ps::fuzz::pool(), ps::fuzz::timer());
  seed(shard, sync);
  ps::Caller caller{
      .worker_index = static_cast<int>(who & 0x7) - 1, .is_chief = false, .peer = "fuzz"};

  capnp::ReaderOptions limits;
  limits.traversalLimitInWords = 64 * 1024;
  limits.nestingLimit = 16;
  const Digest before = digest(shard);
  bool refused = false;
  try {
    capnp::FlatArrayMessageReader reader(
        kj::arrayPtr(reinterpret_cast<const capnp::word*>(words.data()), words.size()), limits);
    capnp::MallocMessageBuilder results;
    kj::Own<MessagePullReply> pull_reply;  // outlives `pending`
    kj::Promise<void> pending = kj::READY_NOW;
    switch (op) {
      case 0: {
        const ps::CreateRequest request =
            ps::create_from_wire(reader.getRoot<ps::wire::Shard::CreateParams>());
        ps::CreateReply reply;
        shard.create(request, reply);
        ps::create_to_wire(request, reply, results.initRoot<ps::wire::Shard::CreateResults>());
        break;
      }
      case 1:
        pull_reply = kj::heap<MessagePullReply>(results);
        pending = shard.pull(
            caller, ps::pull_from_wire(reader.getRoot<ps::wire::Shard::PullParams>()), *pull_reply);
        break;
      case 2:
      case 3: {
        auto reply = kj::heap<ps::PushReply>();
        ps::PushReply& r = *reply;
        pending =
            shard.push(caller, ps::push_from_wire(reader.getRoot<ps::wire::Shard::PushParams>()), r)
                .then([&results, &r] {
                  ps::push_to_wire(r, results.initRoot<ps::wire::Shard::PushResults>());
                })
                .attach(kj::mv(reply));
        break;
      }
      case 4:
        shard.init_job(ps::job_from_wire(reader.getRoot<ps::wire::JobConfig>()));
        break;
      case 5:
        shard.step_done(caller, reader.getRoot<ps::wire::Shard::StepDoneParams>().getStep());
        break;
      case 6:
        shard.hello(caller);
        break;
      // Tables, taken apart as shard_service.cc does.
      case 8: {
        auto params = reader.getRoot<ps::wire::Shard::CreateTablesParams>();
        std::vector<ps::ShardTableSpec> specs;
        for (auto t : params.getTables()) specs.push_back(ps::from_wire(t));
        shard.create_tables(specs, params.getValidateOnly());
        break;
      }
      case 9: {
        auto params = reader.getRoot<ps::wire::Shard::PullRowsParams>();
        auto rows = std::make_shared<std::vector<float>>();
        pending =
            shard.pull_rows(caller,
                            {std::string_view(params.getTable().begin(), params.getTable().size()),
                             ps::ids_in_place(params.getIds(), "pullRows"), params.getMinStep(),
                             params.getLookup()},
                            [rows](std::size_t floats, int64_t) {
                              rows->assign(floats, std::numeric_limits<float>::quiet_NaN());
                              return rows->data();
                            });
        pending = pending.then([rows] {
          for (float x : *rows) {
            if (!std::isfinite(x)) {
              std::fprintf(stderr, "pullRows answered a non-finite value or a row not written\n");
              __builtin_trap();
            }
          }
        });
        break;
      }
      case 10: {
        auto params = reader.getRoot<ps::wire::Shard::PushRowsParams>();
        auto grads = params.getGrads();
        if (grads.size() % sizeof(float) != 0)
          throw ps::RequestError("pushRows: gradients are not a whole number of float32s");
        // Aligned, as the RPC layer's buffers are.
        std::vector<float> g(grads.size() / sizeof(float));
        if (!g.empty()) std::memcpy(g.data(), grads.begin(), grads.size());
        shard.push_rows(caller,
                        {std::string_view(params.getTable().begin(), params.getTable().size()),
                         ps::ids_in_place(params.getIds(), "pushRows"), g, params.getStep(),
                         params.getRequestId(), params.getDoneStep(), /*grads_shared=*/false,
                         params.getIdsDistinct(), params.getParts()});
        break;
      }
      case 11: {
        auto params = reader.getRoot<ps::wire::Shard::RestoreRowsParams>();
        auto floats = [](capnp::Data::Reader d) {
          if (d.size() % sizeof(float) != 0)
            throw ps::RequestError("restoreRows: values are not a whole number of float32s");
          std::vector<float> v(d.size() / sizeof(float));
          if (!v.empty()) std::memcpy(v.data(), d.begin(), d.size());
          return v;
        };
        const std::vector<float> values = floats(params.getValues());
        std::vector<std::vector<float>> slots;
        for (auto s : params.getSlots()) slots.push_back(floats(s));
        std::vector<std::span<const float>> views(slots.begin(), slots.end());
        const std::vector<uint32_t> ages = ps::ages_from_wire(params.getAges());
        shard.restore_rows(std::string_view(params.getTable().begin(), params.getTable().size()),
                           ps::ids_in_place(params.getIds(), "restoreRows"), values, views,
                           params.getVersion(), ages);
        break;
      }
      case 12:
        (void)shard.list_tables();
        break;
      default:
        for (ps::StoredTensor* t : shard.list())
          ps::to_wire_meta(*t, false, results.initRoot<ps::wire::TensorMeta>());
        ps::stats_to_wire(shard, results.initRoot<ps::wire::ShardStats>());
        break;
    }
    // A pull may wait for a step that never comes: run what is ready, then
    // drop it (as a closed connection would).
    pending.poll(ps::fuzz::io().waitScope);
    if (pending.poll(ps::fuzz::io().waitScope)) pending.wait(ps::fuzz::io().waitScope);
  } catch (const ps::Error&) {
    refused = true;
  } catch (const kj::Exception&) {
    refused = true;
  }
  if (refused && !(digest(shard) == before)) {
    std::fprintf(stderr, "a refused request (op %u) changed the shard's state\n", op);
    std::abort();
  }
  ps::fuzz::check_shard_invariants(shard);
  return 0;
}
