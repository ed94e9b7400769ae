// Embedding-table requests as plain values: what the RPC face
// (shard_service.cc) hands the shard, with ids and rows as spans that still
// point into the received message (no copy). The shard and the tables never
// see a Cap'n Proto Reader or Builder.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "ps/embedding.h"
#include "server/shard_requests.h"

namespace ps {

struct PullRowsRequest {
  std::string_view table;
  std::span<const uint64_t> ids;
  int64_t min_step = 0;
  // Creates no row and moves none in the LRU order (EmbeddingTable::lookup).
  bool lookup = false;
};

// Where a pull's rows go: called once with the number of floats and the
// global step they are read at; returns the buffer (in the reply) to fill.
using RowsOut = std::function<float*(std::size_t floats, int64_t step)>;

struct PushRowsRequest {
  std::string_view table;
  std::span<const uint64_t> ids;
  std::span<const float> grads;
  int64_t step = 0;
  uint64_t request_id = 0;
  int64_t done_step = -1;
  // `grads` lies in the caller's shared memory, which the caller can still
  // write: psd copies it out, checking it in the same pass, and applies the copy.
  bool grads_shared = false;
  // The sender says no id is named twice (EmbeddingTable::Repeats::kSenderSaysNone).
  bool ids_distinct = false;
  uint32_t parts = 1;  // the requests this push sends the shard (sync: must be 1)
};

struct PushRowsReply {
  GradientStatus status = GradientStatus::kApplied;
  int64_t step = 0;
  bool stop = false;
};

// A table as a shard reports it (createTables, listTables, stats).
struct TableReport {
  TableSpec spec;
  uint64_t rows_here = 0;
  uint64_t bytes = 0;
  uint64_t version = 0;
  uint64_t evictions = 0;
  uint64_t ids_filtered = 0;  // pushed ids not yet admitted (TableSpec::min_count)
  uint64_t rows_expired = 0;  // rows dropped by TableSpec::expire_after_steps
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
  bool created = false;
};

}  // namespace ps
