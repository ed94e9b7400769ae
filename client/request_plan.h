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

// Throws ConfigError for an undeclared name or a name given twice.
std::vector<ShardBatch> plan_batches(const Placement& placement, const std::vector<std::string>& names,
                                     uint64_t max_batch_bytes);

}  // namespace ps
