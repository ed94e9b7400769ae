// psd's checkpoint files: one file per shard per checkpoint, written
// atomically and checked record by record when read.
//
// Layout on disk (all integers little-endian):
//   <dir>/shard-<i>-of-<n>/ckpt-<step, 12 digits>.psckpt
// so a restore finds the newest step by name and never mixes shards of jobs
// with different shard counts. A file is
//   "PSCKPT\r\n" | uint32 format version | uint32 masked crc32c of the 12 bytes before
//   records: uint64 length | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)
// (TFRecord's framing). The records are: a ckpt::Header (Cap'n Proto, see
// schema/checkpoint.capnp); per tensor a ckpt::TensorHeader and 1 + numSlots
// raw float32 records (values, then slots); per embedding table a
// ckpt::TableHeader and its ids, values, slots, (expiring rows) ages and
// (admission by count) count sketch; a ckpt::Footer repeating
// the counts, so a file cut between records is caught too.
//
// Writing: to "<name>.tmp", fsync, rename over the final name, fsync the
// directory: a crash leaves either the old set of files or the new one.
//
// Example:
//   ps::ShardCheckpoint c = ...;
//   std::string path = ps::write_checkpoint(dir, c);           // atomic
//   ps::prune_checkpoints(dir, c.shard_index, c.num_shards, 3);  // keep the newest 3
//   for (auto& f : ps::list_checkpoints(dir, 0, 1)) { ps::read_checkpoint(f.path); ... }
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/part_meta.h"
#include "ps/checkpoint.h"
#include "ps/embedding.h"
#include "ps/errors.h"
#include "ps/job.h"
#include "ps/tensor_spec.h"

namespace ps {

struct TensorCheckpoint {
  TensorSpec spec;  // name, shape, optimizer, trainable (init unused)
  std::optional<PartMeta> part;
  uint64_t version = 0;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

// One shard's rows of an embedding table (ps/embedding.h).
// A saved count sketch's rows of counters and the most counters a row has
// (server/shard_tables.cc asserts they are server/embedding/count_sketch.h's).
inline constexpr uint32_t kSketchRows = 4;
inline constexpr uint32_t kMaxSketchWidth = uint32_t{1} << 28;

struct TableCheckpoint {
  TableSpec spec;
  uint32_t shard_index = 0;  // where the client placed this part
  uint32_t num_shards = 1;
  uint64_t version = 0;
  std::vector<uint64_t> ids;
  std::vector<float> values;              // ids.size() * dim
  std::vector<std::vector<float>> slots;  // each ids.size() * dim
  // A table whose rows expire: per row, the steps since it was last touched
  // (empty otherwise, and in files of format version 1).
  std::vector<uint32_t> ages;
  // A table admitting ids by count: its count sketch (sketch_width 0
  // otherwise). Only the psd that wrote it reads it back: another shard
  // count places other ids on each shard, with other keys.
  uint64_t sketch_key = 0;
  uint32_t sketch_width = 0;
  std::vector<uint8_t> sketch;  // 4 * sketch_width counters
};

// A push request id a shard has applied, and its answer.
struct RecentRequest {
  uint64_t id = 0;
  int64_t step = 0;
  std::vector<uint8_t> statuses;
};

struct ShardCheckpoint {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int64_t global_step = 0;
  bool job_configured = false;
  JobConfig job;
  bool ready = false;
  double unix_secs = 0;
  std::map<int, std::vector<RecentRequest>> requests;  // by worker index, oldest first
  // Clients without a worker index, by their hello's client id (those that
  // gave none: requests[-1]), oldest first.
  std::map<uint64_t, std::vector<RecentRequest>> client_requests;
  std::vector<TensorCheckpoint> tensors;
  std::vector<TableCheckpoint> tables;
};

struct CheckpointFile {
  std::string path;
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int64_t step = 0;
};

std::string shard_checkpoint_dir(const std::string& dir, uint32_t shard_index, uint32_t num_shards);

// Creates the shard's directory and checks that a file can be written
// there. Throws ps::Error naming the path and the reason.
void check_checkpoint_dir(const std::string& dir, uint32_t shard_index, uint32_t num_shards);

// Writes atomically; returns the final path. Never replaces a valid file of
// the same step that holds more tensors (a restore that left bad tensors
// out must not lose the good file's copy of them): the new file then goes
// to "<path>.incomplete", which no restore reads, that path is returned and
// *kept_fuller (if given) set. Throws ps::Error on I/O errors.
std::string write_checkpoint(const std::string& dir, const ShardCheckpoint& c,
                             bool* kept_fuller = nullptr);

// The tensor count in a checkpoint's header (the header checked, the rest
// not read); nullopt when there is no such file or its header is invalid.
std::optional<uint64_t> checkpoint_tensor_count(const std::string& path);

// Reads and checks a whole file. Throws CheckpointError (or ps::Error when
// the file cannot be opened).
ShardCheckpoint read_checkpoint(const std::string& path);

// One shard's files, newest step first (by name; contents not checked).
std::vector<CheckpointFile> list_checkpoints(const std::string& dir, uint32_t shard_index,
                                             uint32_t num_shards);
// Every shard's files under `dir`, any shard count.
std::vector<CheckpointFile> list_all_checkpoints(const std::string& dir);

// Removes all but the newest `keep` files of the shard (and stray .tmp
// files). With `written` (the step of the file just written): the newest
// `keep` up to that step, and none newer than it: files from further on
// were not written by this run (a psd that restored an older checkpoint
// because it could not take those), and must not push its own out.
void prune_checkpoints(const std::string& dir, uint32_t shard_index, uint32_t num_shards,
                       uint32_t keep, int64_t written = INT64_MAX);

}  // namespace ps
