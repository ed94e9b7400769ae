// The translation between the wire and Shard's plain types
// (server/shard_wire.h), without a socket: requests read into plain structs
// pointing into the message, and a pull reply that sends large tensors from
// their snapshots (at most 64 a reply) and copies the rest.
#include <catch2/catch.hpp>

#include <cstdio>

#include <capnp/message.h>

#include "common/wire_convert.h"
#include "server/shard_wire.h"

namespace {

// A connection that only records what it is asked to hold: the pull reply
// needs nothing more of the socket (common/net/connection_control.h).
class HoldingConnection final : public ps::ConnectionControl {
 public:
  std::vector<std::pair<const void*, std::shared_ptr<const void>>> held;

  void hold_until_sent(const void* data, std::shared_ptr<const void> hold) override {
    held.emplace_back(data, std::move(hold));
  }
  void abort() override {}
};

class MessagePullReply final : public ps::WirePullReply {
 public:
  MessagePullReply(uint64_t tag, ps::ConnectionControl* connection)
      : WirePullReply(tag, connection) {}
  ~MessagePullReply() noexcept override = default;  // MallocMessageBuilder's is noexcept(false)
  capnp::MallocMessageBuilder message;
  capnp::MessageSize asked{0, 0};

 private:
  ps::wire::Shard::PullResults::Builder results(capnp::MessageSize size) override {
    asked = size;
    return message.initRoot<ps::wire::Shard::PullResults>();
  }
};

std::shared_ptr<const std::vector<float>> values_of(std::size_t n, float first) {
  auto v = std::make_shared<std::vector<float>>(n);
  for (std::size_t i = 0; i < n; ++i) (*v)[i] = first + static_cast<float>(i);
  return v;
}

}  // namespace

TEST_CASE("a pull reply sends at most 64 large tensors from their snapshots and copies the rest") {
  HoldingConnection connection;
  MessagePullReply reply(77, &connection);
  // 70 tensors of 64 KiB, one of 4 KiB, one of 64 KiB + 4 bytes (not whole words), one in shared
  // memory.
  std::vector<std::string> names;
  std::vector<ps::PullReply::Tensor> layout;
  const std::size_t big = 16 << 10;  // floats: 64 KiB
  for (int i = 0; i < 70; ++i) {
    char name[8];
    std::snprintf(name, sizeof name, "t%d", i);
    names.emplace_back(name);
  }
  names.insert(names.end(), {"small", "odd", "shared"});
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::size_t floats = names[i] == "small" ? 1024 : names[i] == "odd" ? big + 1 : big;
    layout.push_back({names[i], floats * sizeof(float), names[i] == "shared"});
  }
  reply.start(layout);
  // The first segment holds everything but the tensors that may go in place.
  CHECK(reply.asked.wordCount > (4096 + 65540) / 8);
  CHECK(reply.asked.wordCount < (4096 + 65540) / 8 + 2000);
  reply.step(12);
  std::vector<std::shared_ptr<const std::vector<float>>> snapshots;
  for (std::size_t i = names.size(); i-- > 0;) {  // any order
    if (layout[i].in_shared) {
      reply.in_shared(i, 5);
      continue;
    }
    auto v = values_of(layout[i].bytes / sizeof(float), static_cast<float>(i));
    snapshots.push_back(v);
    reply.value(i, 100 + i, v);
  }
  CHECK(connection.held.empty());  // nothing pinned before the reply is complete
  reply.done();
  CHECK(connection.held.size() == 64);

  auto r = reply.message.getRoot<ps::wire::Shard::PullResults>().asReader();
  CHECK(r.getTag() == 77);
  CHECK(r.getStep() == 12);
  auto tensors = r.getTensors();
  REQUIRE(tensors.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO("tensor " << names[i]);
    CHECK(tensors[i].getName() == names[i].c_str());
    if (layout[i].in_shared) {
      CHECK(tensors[i].getVersion() == 5);
      CHECK(tensors[i].getValues().size() == 0);
      continue;
    }
    CHECK(tensors[i].getVersion() == 100 + i);
    auto data = ps::as_floats(tensors[i].getValues());
    REQUIRE(data.size() == layout[i].bytes / sizeof(float));
    CHECK(data[0] == static_cast<float>(i));
    CHECK(data.back() == static_cast<float>(i + data.size() - 1));
    // The first 64 large ones point at their snapshots; the rest are copies.
    bool pinned = false;
    for (auto& [p, hold] : connection.held) pinned = pinned || p == data.data();
    CHECK(pinned == (i < 64));
  }
}

TEST_CASE("without a connection every value is copied") {
  MessagePullReply reply(0, nullptr);
  const std::string name = "w";
  std::vector<ps::PullReply::Tensor> layout{{name, 64 << 10, false}};
  reply.start(layout);
  reply.step(0);
  auto v = values_of(16 << 10, 1);
  reply.value(0, 3, v);
  reply.done();
  auto data =
      reply.message.getRoot<ps::wire::Shard::PullResults>().asReader().getTensors()[0].getValues();
  CHECK(data.begin() != reinterpret_cast<const kj::byte*>(v->data()));
  CHECK(ps::as_floats(data)[5] == 6);
}

TEST_CASE("push and pull requests point into the message; statuses keep the wire's numbering") {
  capnp::MallocMessageBuilder m;
  auto push = m.initRoot<ps::wire::Shard::PushParams>();
  push.setStep(4);
  push.setRequestId(9);
  auto grads = push.initGrads(2);
  const std::vector<float> g{1, 2, 3};
  grads[0].setName("a");
  grads[0].setValues(ps::as_data(g));
  grads[1].setName("b");
  auto slice = grads[1].initShared();
  slice.setRegion(1);
  slice.setOffset(64);
  slice.setBytes(12);
  const ps::PushRequest request = ps::push_from_wire(push.asReader());
  CHECK(request.step == 4);
  CHECK(request.request_id == 9);
  CHECK(request.done_step == -1);  // the schema's default: no step report
  REQUIRE(request.grads.size() == 2);
  CHECK(request.grads[0].name == "a");
  CHECK(request.grads[0].bytes == 12);
  CHECK(request.grads[0].values.data() ==
        ps::as_floats(push.asReader().getGrads()[0].getValues()).data());  // no copy
  CHECK(request.grads[0].values[2] == 3);
  CHECK_FALSE(request.grads[0].shared);
  REQUIRE(request.grads[1].shared);
  CHECK(request.grads[1].shared->offset == 64);
  CHECK(request.grads[1].shared->bytes == 12);

  capnp::MallocMessageBuilder out;
  ps::PushReply reply{{ps::GradientStatus::kStale, ps::GradientStatus::kDuplicate}, 8, true};
  auto results = out.initRoot<ps::wire::Shard::PushResults>();
  ps::push_to_wire(reply, results);
  CHECK(results.getStatus()[0] == ps::wire::PushStatus::STALE);
  CHECK(results.getStatus()[1] == ps::wire::PushStatus::DUPLICATE);
  CHECK(results.getStep() == 8);
  CHECK(results.getStop());

  capnp::MallocMessageBuilder p;
  auto pull = p.initRoot<ps::wire::Shard::PullParams>();
  pull.initNames(2).set(0, "x");
  pull.getNames().set(1, "yy");
  pull.setMinStep(-3);
  const ps::PullRequest pr = ps::pull_from_wire(pull.asReader());
  CHECK(pr.names == std::vector<std::string_view>{"x", "yy"});
  CHECK(pr.min_step == -3);
  CHECK(pr.into.empty());
}
