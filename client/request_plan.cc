#include "client/request_plan.h"

#include <set>

#include "ps/errors.h"

namespace ps {

std::vector<ShardBatch> plan_batches(const Placement& placement,
                                     const std::vector<std::string>& names,
                                     uint64_t max_batch_bytes,
                                     const std::vector<uint32_t>& copies) {
  std::vector<std::vector<ShardBatch>> per_shard(placement.num_shards());
  std::set<std::string> seen;
  for (std::size_t t = 0; t < names.size(); ++t) {
    if (!seen.insert(names[t]).second)
      throw ConfigError("tensor '" + names[t] + "' named twice in one request");
    const PlacedTensor& tensor = placement.at(names[t]);
    // Names and the shape ride with every part (long names overran the
    // limit: 4000 one-float tensors with 500-character names).
    const uint64_t described =
        kPartOverheadBytes + 2 * tensor.spec.name.size() + 8 * tensor.spec.shape.size();
    for (const Part& part : tensor.parts) {
      auto& batches = per_shard[part.shard];
      const uint64_t bytes = part.count * sizeof(float) * (copies.empty() ? 1 : copies[t]) +
                             described + part.stored_name.size();
      if (batches.empty() ||
          (batches.back().bytes + bytes > max_batch_bytes && !batches.back().parts.empty())) {
        batches.push_back(ShardBatch{part.shard, {}, 0});
      }
      batches.back().parts.push_back({t, part});
      batches.back().bytes += bytes;
    }
  }
  std::vector<ShardBatch> out;
  for (auto& batches : per_shard) {
    for (auto& b : batches) out.push_back(std::move(b));
  }
  return out;
}

}  // namespace ps
