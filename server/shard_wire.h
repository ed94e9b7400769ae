// The one translation point between the wire (schema/ps.capnp) and Shard's
// plain request types (shard_requests.h), each way. The RPC face
// (shard_service.cc) and the fuzzer use it; Shard itself never sees a
// Cap'n Proto message on its data path. Conversions read lazily checked
// Cap'n Proto data: a malformed message throws kj::Exception from here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/net/connection_control.h"
#include "schema/ps.capnp.h"
#include "server/shard_requests.h"
#include "server/tensor_store.h"

namespace ps {

class Shard;

// What stats and hello/initJob answer about the shard.
void stats_to_wire(const Shard& shard, wire::ShardStats::Builder out);
void info_to_wire(const Shard& shard, wire::ShardInfo::Builder out);

CreateRequest create_from_wire(wire::Shard::CreateParams::Reader params);
void create_to_wire(const CreateRequest& request, const CreateReply& reply,
                    wire::Shard::CreateResults::Builder results);
void to_wire_meta(const StoredTensor& t, bool created, wire::TensorMeta::Builder out);

PushRequest push_from_wire(wire::Shard::PushParams::Reader params);
void push_to_wire(const PushReply& reply, wire::Shard::PushResults::Builder results);

PullRequest pull_from_wire(wire::Shard::PullParams::Reader params);

// A pull's reply message. Its first segment is sized at start() to hold
// everything but the tensors sent in place, so all of it lands ahead of
// those tensors' own segments (a client then knows where each tensor goes
// before its bytes arrive). With a connection, tensors of kPullSegmentBytes
// and more are sent from their snapshot's memory, which the connection holds
// until written; they go to it only at done(), so a reply that fails is
// never written and holds nothing. Without one, values are copied.
class WirePullReply : public PullReply {
 public:
  WirePullReply(uint64_t tag, ConnectionControl* connection) : tag_(tag), connection_(connection) {}

  void start(std::span<const Tensor> tensors) override;
  void step(int64_t global_step) override { results_.setStep(global_step); }
  void value(std::size_t i, uint64_t version,
             std::shared_ptr<const std::vector<float>> values) override;
  void in_shared(std::size_t i, uint64_t version) override {
    entries_[static_cast<unsigned>(i)].setVersion(version);
  }
  void done() override;

 protected:
  // The reply message's root, its first segment at least `size` (the call
  // context's getResults, or the fuzzer's own message).
  virtual wire::Shard::PullResults::Builder results(capnp::MessageSize size) = 0;

 private:
  uint64_t tag_;
  ConnectionControl* connection_;
  wire::Shard::PullResults::Builder results_ = nullptr;
  capnp::List<wire::TensorData>::Builder entries_ = nullptr;
  std::size_t in_place_before_ =
      SIZE_MAX;  // tensors from this index on are copied (no connection, or the cap)
  std::vector<std::shared_ptr<const std::vector<float>>> held_;
};

}  // namespace ps
