// libFuzzer target over psd's request handling: the input is an operation
// byte, a caller byte and a serialized Cap'n Proto message, read (as psd's
// RPC layer would) with a tight traversal limit and handed to the Shard
// handler as its params. Checks, besides the sanitizers' own: a handler that
// refuses a request (throws) has changed nothing, and whatever the request,
// the shard stores no NaN or Inf and no name with a control character
// (shard_invariants.h; a tensor with SGD at learning rate 1e38 is there to
// be pushed past FLT_MAX).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include "ps/errors.h"
#include "server/shard.h"
#include "server/shard_wire.h"
#include "fuzz/shard_env.h"
#include "fuzz/shard_invariants.h"
#include "common/wire_convert.h"

namespace {

// Everything a refused request must leave as it was.
struct Digest {
  uint64_t tensors, bytes, versions, pushes, creates, steps_applied;
  int64_t step;
  bool ready, configured, finished;
  float checksum;
  bool operator==(const Digest&) const = default;
};

Digest digest(ps::Shard& shard) {
  Digest d{};
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
  const uint8_t op = data[0] % 8;
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
