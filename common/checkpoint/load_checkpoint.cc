// load_checkpoint: reassembles logical tensors from every shard's file of
// one step (ps/checkpoint.h).
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "common/checkpoint/checkpoint_file.h"
#include "ps/checkpoint.h"

namespace ps {
namespace {

// Puts every shard's tensors back together. Throws CheckpointError when a
// split tensor's parts do not cover it exactly.
std::vector<TensorSpec> reassemble(const std::vector<ShardCheckpoint>& shards) {
  std::map<std::string, TensorSpec> whole;
  std::map<std::string, uint64_t> covered;
  std::vector<std::string> order;  // first appearance, for a stable placement
  for (const auto& shard : shards) {
    for (const auto& t : shard.tensors) {
      const std::string name = t.part ? t.part->full_name : t.spec.name;
      auto [it, fresh] = whole.try_emplace(name);
      TensorSpec& spec = it->second;
      if (fresh) {
        order.push_back(name);
        spec = t.spec;
        spec.name = name;
        spec.init = InitConfig::from_values({});
        if (t.part) spec.shape = t.part->full_shape;
        const uint64_t n = spec.num_elements();
        if (n > (uint64_t{1} << 36))
          throw CheckpointError("checkpoint: tensor '" + name + "' is implausibly large");
        spec.init.values.assign(n, 0.0f);
        spec.slots.assign(t.slots.size(), std::vector<float>(n, 0.0f));
        spec.version = 0;
      } else if (!t.part) {
        throw CheckpointError("checkpoint: tensor '" + name + "' is stored twice");
      }
      // Offsets come from the file: checked without overflow, slots too.
      const uint64_t offset = t.part ? t.part->offset : 0;
      const uint64_t size = spec.init.values.size();
      bool fits =
          offset <= size && t.values.size() <= size - offset && t.slots.size() == spec.slots.size();
      for (const auto& slot : t.slots) fits = fits && slot.size() == t.values.size();
      if (!fits)
        throw CheckpointError("checkpoint: a part of '" + name + "' does not fit the tensor");
      std::memcpy(spec.init.values.data() + offset, t.values.data(),
                  t.values.size() * sizeof(float));
      for (std::size_t s = 0; s < t.slots.size(); ++s) {
        std::memcpy(spec.slots[s].data() + offset, t.slots[s].data(),
                    t.slots[s].size() * sizeof(float));
      }
      // Parts of one tensor are updated together; in async modes they can
      // differ by the updates in flight when each shard saved. The newest
      // count drives Adam's bias correction and the learning-rate schedule.
      spec.version = std::max(spec.version, t.version);
      covered[name] += t.values.size();
    }
  }
  std::vector<TensorSpec> out;
  for (const auto& name : order) {
    TensorSpec& spec = whole[name];
    if (covered[name] != spec.num_elements()) {
      throw CheckpointError("checkpoint: the parts of '" + name + "' cover " +
                            std::to_string(covered[name]) + " of " +
                            std::to_string(spec.num_elements()) + " elements");
    }
    out.push_back(std::move(spec));
  }
  return out;
}

// Every shard's rows of each table, in one RestoredTable per table.
std::vector<RestoredTable> merge_tables(const std::vector<ShardCheckpoint>& shards) {
  std::map<std::string, RestoredTable> merged;
  std::vector<std::string> order;
  std::set<std::string> without_ages;
  for (const auto& shard : shards) {
    for (const auto& t : shard.tables) {
      auto [it, fresh] = merged.try_emplace(t.spec.name);
      RestoredTable& r = it->second;
      if (fresh) {
        order.push_back(t.spec.name);
        r.spec = t.spec;
        r.slots.resize(t.slots.size());
      } else if (r.spec.dim != t.spec.dim || r.slots.size() != t.slots.size()) {
        throw CheckpointError("checkpoint: shards disagree on table '" + t.spec.name + "'");
      }
      r.version = std::max(r.version, t.version);
      // Ages are kept only where every shard's file has them (a file of
      // format version 1 has none: its rows count as touched at the restore).
      if (t.ages.size() != t.ids.size()) without_ages.insert(t.spec.name);
      r.ages.insert(r.ages.end(), t.ages.begin(), t.ages.end());
      r.ids.insert(r.ids.end(), t.ids.begin(), t.ids.end());
      r.values.insert(r.values.end(), t.values.begin(), t.values.end());
      for (std::size_t k = 0; k < t.slots.size(); ++k)
        r.slots[k].insert(r.slots[k].end(), t.slots[k].begin(), t.slots[k].end());
    }
  }
  std::vector<RestoredTable> out;
  for (const auto& name : order) {
    RestoredTable& r = merged[name];
    if (without_ages.count(name) != 0) r.ages.clear();
    if (!r.spec.dynamic && r.ids.size() != r.spec.rows) {
      throw CheckpointError("checkpoint: the shards hold " + std::to_string(r.ids.size()) +
                            " of the " + std::to_string(r.spec.rows) + " rows of table '" + name +
                            "'");
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

RestoredModel load_checkpoint(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw CheckpointError(
        "no checkpoint directory " + dir +
        (::stat(dir.c_str(), &st) != 0 ? " (it does not exist)" : " (not a directory)") +
        ": give a directory a ps task's --checkpoint_dir wrote");
  }
  // (shard count, step) -> files of the shards that have that step.
  std::map<std::pair<uint32_t, int64_t>, std::map<uint32_t, std::string>> sets;
  for (const auto& f : list_all_checkpoints(dir))
    sets[{f.num_shards, f.step}][f.shard_index] = f.path;
  std::vector<std::pair<uint32_t, int64_t>> complete;
  for (const auto& [key, files] : sets) {
    if (files.size() == key.first) complete.push_back(key);
  }
  // Newest step first; among equal steps, the layout with more shards.
  std::sort(complete.begin(), complete.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first > b.first;
  });
  std::string problems;
  for (const auto& key : complete) {
    std::vector<ShardCheckpoint> shards;
    RestoredModel m;
    try {
      for (const auto& [index, path] : sets[key]) {
        shards.push_back(read_checkpoint(path));
        m.files.push_back(path);
        if (shards.back().global_step != key.second)
          throw CheckpointError("checkpoint " + path + " holds another step");
      }
      m.tensors = reassemble(shards);
      m.tables = merge_tables(shards);
    } catch (const Error& e) {
      spdlog::warn("skipping checkpoint step {} of {} shards: {}", key.second, key.first, e.what());
      problems += std::string("; ") + e.what();
      continue;
    }
    m.global_step = key.second;
    m.num_shards = key.first;
    m.job_configured = shards[0].job_configured;
    m.job = shards[0].job;
    spdlog::info("loaded checkpoint of step {} written by {} shards ({} tensors)", m.global_step,
                 m.num_shards, m.tensors.size());
    return m;
  }
  throw CheckpointError("no complete valid checkpoint under " + dir + problems);
}

}  // namespace ps
