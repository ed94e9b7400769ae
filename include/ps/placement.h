// Where each tensor lives: which shard, and, for tensors larger than the
// chunk size, which chunks go where; and the parts each is stored in.
//
// Placement is a pure function of the declared tensors (in declaration order),
// the number of shards, the policy and the chunk size. Every worker computes
// the same placement from the same declarations, as TensorFlow's
// replica_device_setter does, so no coordination is needed.
//
// Example:
//   ps::Placement p(/*num_shards=*/3, ps::PlacementPolicy::kGreedyBytes);
//   p.add({.name = "emb", .shape = {1'000'000, 64}});   // 256 MB: 62 chunks of 4 parts
//   p.add({.name = "b", .shape = {64}});
//   for (const ps::Part& part : p.parts_of("emb")) { ... part.shard ... }
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ps/tensor_spec.h"

namespace ps {

enum class PlacementPolicy {
  kRoundRobin,   // next shard in declaration order (replica_device_setter)
  kGreedyBytes,  // shard holding the fewest bytes so far (GreedyLoadBalancingStrategy)
};

// Tensors larger than a chunk are split into chunks spread over the shards.
// Every tensor is stored (and sent) in parts of at most kDefaultPartBytes:
// the parts of one chunk share its shard. Parts are the unit of transfer,
// so a large tensor's parts are copied, sent and applied in a pipeline (a
// 4 MiB push: 0.43 of plain TCP as one part, 0.8-1.0 as four).
inline constexpr std::size_t kDefaultChunkBytes = 4u << 20;
inline constexpr std::size_t kDefaultPartBytes = 1u << 20;

// One stored piece of a logical tensor: elements [offset, offset + count) of
// the flattened tensor, held on `shard` under `stored_name`.
struct Part {
  std::string stored_name;  // the tensor's own name when it is not split
  int shard = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
  uint32_t index = 0;
  uint32_t num_parts = 1;
};

struct PlacedTensor {
  TensorSpec spec;  // as declared, without initial values and restored slots (not kept)
  std::vector<Part> parts;
};

class Placement {
 public:
  Placement(int num_shards, PlacementPolicy policy, std::size_t chunk_bytes = kDefaultChunkBytes,
            std::size_t part_bytes = kDefaultPartBytes);

  // Places a tensor. Adding a name twice returns the first placement when the
  // shape matches and throws ConfigError otherwise.
  const PlacedTensor& add(const TensorSpec& spec);

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const PlacedTensor& at(const std::string& name) const;  // throws ConfigError
  const std::vector<Part>& parts_of(const std::string& name) const { return at(name).parts; }
  const std::vector<PlacedTensor>& tensors() const { return tensors_; }

  int num_shards() const { return num_shards_; }
  std::size_t chunk_bytes() const { return chunk_bytes_; }
  std::size_t part_bytes() const { return part_bytes_; }
  uint64_t shard_bytes(int shard) const { return shard_bytes_.at(shard); }

  // Name under which part `index` of `name` is stored, as TF names
  // partitioned variables: "name/part_3". add() refuses such names.
  static std::string part_name(const std::string& name, uint32_t index);
  static bool is_part_name(const std::string& name);

  // Beyond these, counts would wrap; add() refuses such tensors.
  static constexpr uint64_t kMaxElements = uint64_t{1} << 61;
  static constexpr uint64_t kMaxParts = uint64_t{1} << 24;

  // Where the placement stands: rollback(mark()) later takes back every
  // tensor added since, and the shard choices they moved on (a create that
  // psd refused must leave the next tensors placed as on the workers that
  // never declared it).
  struct Mark {
    std::size_t tensors = 0;
    int next_round_robin = 0;
    std::vector<uint64_t> shard_bytes;
  };
  Mark mark() const { return {tensors_.size(), next_round_robin_, shard_bytes_}; }
  void rollback(const Mark& m);
  // add() calls so far, a name added again included: whether anyone
  // declared anything since (a rollback would take back a tensor that
  // another declaration relies on, even one that only repeated it).
  uint64_t adds() const { return adds_; }

 private:
  int pick_shard();

  int num_shards_;
  PlacementPolicy policy_;
  std::size_t chunk_bytes_;
  std::size_t part_bytes_;  // never more than chunk_bytes_
  int next_round_robin_ = 0;
  std::vector<uint64_t> shard_bytes_;
  std::vector<PlacedTensor> tensors_;
  std::map<std::string, std::size_t> index_;
  uint64_t adds_ = 0;
};

}  // namespace ps
