// Turns "these tensors" into "these RPCs": every part of every named tensor
// grouped by shard, each shard's parts cut into batches that stay under the
// largest message a shard accepts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ps/placement.h"

namespace ps {

struct PartRef {
  std::size_t tensor;  // index into the request's list of names
  Part part;           // a copy: the placement may grow meanwhile
};

struct ShardBatch {
  int shard = 0;
  std::vector<PartRef> parts;
  uint64_t bytes = 0;
};

// What a part costs in a message besides its values, its names and its
// shape (list entries, the spec's other fields), so that many small
// tensors do not add up past the limit.
constexpr uint64_t kPartOverheadBytes = 256;

// Throws ConfigError for an undeclared name or a name given twice.
// `copies[t]`: how many arrays of its part's size a request carries for
// names[t] (a create: initial values and restored optimizer slots, or none
// at all); empty: one each (a push or pull).
std::vector<ShardBatch> plan_batches(const Placement& placement,
                                     const std::vector<std::string>& names,
                                     uint64_t max_batch_bytes,
                                     const std::vector<uint32_t>& copies = {});

}  // namespace ps
