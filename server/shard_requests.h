// The plain request and reply types of Shard's data path (as ps-lite's
// KVMeta/KVPairs): the RPC face (shard_service.cc) turns each Cap'n Proto
// request into one of these and each outcome back into its reply, so Shard
// knows neither Cap'n Proto nor sockets, and tests can drive it directly.
//
// Spans and string_views point into the received message: no tensor data is
// copied on the way in. A request only has to stay valid until the Shard
// call returns, the memory its gradients point to until that call's promise
// settles. Refusals are thrown as ps::RequestError (include/ps/errors.h).
//
//   PushRequest req;
//   req.grads.push_back({"w", std::span<const float>(g), g.size() * sizeof(float)});
//   PushReply reply;
//   shard.push(caller, req, reply).wait(io.waitScope);  // reply.status[0]: kApplied
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/part_meta.h"
#include "ps/tensor_spec.h"

namespace ps {

class StoredTensor;

struct CreateRequest {
  struct Tensor {
    TensorSpec spec{};
    std::optional<PartMeta> part{};  // set: a part of a tensor split over shards
  };
  std::vector<Tensor> tensors{};
  bool validate_only = false;    // check against the store's limits, create nothing
  bool values_left_out = false;  // validating only: the specs carry no initial values
  // Validating only: what earlier checks of the same create found new here.
  uint64_t pending_tensors = 0;
  uint64_t pending_bytes = 0;
};

struct CreateReply {
  struct Tensor {
    const StoredTensor* tensor = nullptr;
    bool created = false;  // false: it existed already (the same spec)
  };
  std::vector<Tensor> tensors{};  // in request order; empty when validating
  // Validating: the pending counts with this request's new tensors added.
  uint64_t pending_tensors = 0;
  uint64_t pending_bytes = 0;
};

// Bytes in the caller's shared memory region (attachMemory).
struct SharedSliceRef {
  uint32_t region = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// One tensor's gradient.
struct PushGradient {
  std::string_view name{};
  std::span<const float> values{};  // empty when `shared` is set
  uint64_t bytes = 0;  // what the request carried (a count not a multiple of 4 is refused)
  std::optional<SharedSliceRef> shared{};  // set: the values are there instead
};

struct PushRequest {
  std::vector<PushGradient> grads{};
  int64_t step = 0;  // the global step the worker's parameters were pulled at (sync mode)
  uint64_t request_id =
      0;                   // nonzero: a retry with the same id is answered again, not applied twice
  int64_t done_step = -1;  // >= 0: also reports that local step as done (stepDone)
};

// What became of one gradient. The numbering is the wire's (wire::PushStatus):
// the request log, and so checkpoints, store it.
enum class GradientStatus : uint8_t { kApplied = 0, kAccumulated = 1, kStale = 2, kDuplicate = 3 };

struct PushReply {
  std::vector<GradientStatus> status{};  // per gradient, in request order
  int64_t step = 0;   // the global step; with done_step >= 0 the one after counting it
  bool stop = false;  // with done_step >= 0: the job reached train_steps
};

struct PullRequest {
  std::vector<std::string_view> names{};
  int64_t min_step = 0;  // read at a global step >= this (waits); negative: the same as 0
  // Empty, or one slice per name: a slice of nonzero size gets that
  // tensor's values instead of the reply.
  std::vector<SharedSliceRef> into{};
};

// Where a pull's values go: the face's reply, which it lays out and sends.
// Shard calls it on the event loop, in this order: start() once, after the
// request passed its checks; step() once the wait is over; value() or
// in_shared() once per tensor (in any order); done() when all are in. A
// pull that fails or is cancelled stops anywhere before done().
class PullReply {
 public:
  struct Tensor {
    std::string_view name{};
    uint64_t bytes = 0;      // its values' size
    bool in_shared = false;  // written to the caller's shared memory, not to the reply
  };
  virtual ~PullReply() = default;
  virtual void start(std::span<const Tensor> tensors) = 0;
  virtual void step(int64_t global_step) = 0;
  // Tensor i, read at `version`: a snapshot that never changes, which the
  // reply may copy or keep until it is sent.
  virtual void value(std::size_t i, uint64_t version,
                     std::shared_ptr<const std::vector<float>> values) = 0;
  virtual void in_shared(std::size_t i, uint64_t version) = 0;
  virtual void done() = 0;
};

}  // namespace ps
