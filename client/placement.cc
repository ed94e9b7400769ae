#include "ps/placement.h"

#include <algorithm>

#include "ps/errors.h"

namespace ps {

Placement::Placement(int num_shards, PlacementPolicy policy, std::size_t chunk_bytes,
                     std::size_t part_bytes)
    : num_shards_(num_shards),
      policy_(policy),
      chunk_bytes_(chunk_bytes),
      part_bytes_(std::min(part_bytes, chunk_bytes)) {
  if (num_shards < 1)
    throw ConfigError("placement needs at least one shard, got " + std::to_string(num_shards));
  if (chunk_bytes < sizeof(float)) throw ConfigError("chunk size must hold at least one float");
  if (part_bytes < sizeof(float)) throw ConfigError("part size must hold at least one float");
  shard_bytes_.assign(num_shards, 0);
}

std::string Placement::part_name(const std::string& name, uint32_t index) {
  return name + "/part_" + std::to_string(index);
}

int Placement::pick_shard() {
  if (policy_ == PlacementPolicy::kRoundRobin) {
    int s = next_round_robin_;
    next_round_robin_ = (next_round_robin_ + 1) % num_shards_;
    return s;
  }
  return static_cast<int>(std::min_element(shard_bytes_.begin(), shard_bytes_.end()) -
                          shard_bytes_.begin());
}

bool Placement::is_part_name(const std::string& name) {
  const auto slash = name.rfind("/part_");
  if (slash == std::string::npos || slash + 6 == name.size()) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(slash + 6), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

const PlacedTensor& Placement::add(const TensorSpec& spec) {
  ++adds_;
  if (spec.name.empty()) throw ConfigError("tensor name must not be empty");
  if (auto it = index_.find(spec.name); it != index_.end()) {
    const PlacedTensor& existing = tensors_[it->second];
    if (existing.spec.shape != spec.shape) {
      throw ConfigError("tensor '" + spec.name + "' declared twice with shapes " +
                        shape_to_string(existing.spec.shape) + " and " +
                        shape_to_string(spec.shape));
    }
    return existing;
  }
  if (is_part_name(spec.name)) {
    // psd stores split tensors' parts under such names: "w/part_5" next to
    // a split "w" clashed on some shard counts only (a model that trained
    // could not be restored into another).
    throw ConfigError("tensor '" + spec.name +
                      "': names ending in /part_<number> are kept for the parts of split tensors");
  }
  const uint64_t n = spec.num_elements();
  if (n == 0)
    throw ConfigError("tensor '" + spec.name + "' has no elements: shape " +
                      shape_to_string(spec.shape));
  // Counts past these wrapped: a shape of 2^64-1 elements was placed in 0
  // parts and its create "succeeded".
  if (n > kMaxElements) {
    throw ConfigError("tensor '" + spec.name + "' of shape " + shape_to_string(spec.shape) +
                      " has more than 2^61 elements");
  }
  const uint64_t per_chunk = chunk_bytes_ / sizeof(float);
  const uint64_t per_part = part_bytes_ / sizeof(float);
  const uint64_t parts_per_chunk = (per_chunk + per_part - 1) / per_part;
  const uint64_t num_chunks = n / per_chunk + (n % per_chunk != 0);
  const uint64_t last_chunk = n - (num_chunks - 1) * per_chunk;
  const uint64_t num_parts =
      (num_chunks - 1) * parts_per_chunk + (last_chunk + per_part - 1) / per_part;
  if (num_parts > kMaxParts) {
    throw ConfigError("tensor '" + spec.name + "' of shape " + shape_to_string(spec.shape) +
                      " would be cut into " + std::to_string(num_parts) + " parts of " +
                      std::to_string(part_bytes_) +
                      " bytes, more than 2^24 (raise ClientOptions::part_bytes)");
  }
  if (num_parts > 1 &&
      part_name(spec.name, static_cast<uint32_t>(num_parts - 1)).size() > kMaxNameBytes) {
    throw ConfigError("tensor '" + spec.name.substr(0, 40) + "...': split in " +
                      std::to_string(num_parts) +
                      " parts, its parts' names (\"/part_<i>\" added) pass psd's " +
                      std::to_string(kMaxNameBytes) + " characters: shorten it");
  }

  PlacedTensor placed{spec, {}};
  placed.spec.init.values = {};  // the create sent them; kept, a restore would hold the model twice
  placed.spec.slots = {};
  for (uint64_t c = 0; c < num_chunks; ++c) {
    const int shard = pick_shard();
    const uint64_t chunk_start = c * per_chunk;
    const uint64_t chunk_end = std::min(n, chunk_start + per_chunk);
    for (uint64_t offset = chunk_start; offset < chunk_end; offset += per_part) {
      Part part;
      part.index = static_cast<uint32_t>(placed.parts.size());
      part.num_parts = static_cast<uint32_t>(num_parts);
      part.offset = offset;
      part.count = std::min(per_part, chunk_end - offset);
      part.stored_name = num_parts == 1 ? spec.name : part_name(spec.name, part.index);
      part.shard = shard;
      shard_bytes_[shard] += part.count * sizeof(float);
      placed.parts.push_back(std::move(part));
    }
  }
  index_[spec.name] = tensors_.size();
  tensors_.push_back(std::move(placed));
  return tensors_.back();
}

void Placement::rollback(const Mark& m) {
  for (std::size_t i = m.tensors; i < tensors_.size(); ++i) index_.erase(tensors_[i].spec.name);
  tensors_.resize(std::min(m.tensors, tensors_.size()));
  next_round_robin_ = m.next_round_robin;
  shard_bytes_ = m.shard_bytes;
}

const PlacedTensor& Placement::at(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw ConfigError("unknown tensor '" + name + "': declare it with create() first");
  return tensors_[it->second];
}

}  // namespace ps
