// Embedding tables: variables whose unit is a row of `dim` floats addressed
// by a 64-bit id, pulled and pushed a batch of ids at a time (as
// tf.nn.embedding_lookup over a partitioned variable, and its IndexedSlices
// gradient applied with a row-wise optimizer on the ps).
//
// A fixed table has `rows` rows (ids in [0, rows)), spread over the shards
// 'mod' (id % shards) or 'div' (contiguous ranges) as TF's
// partition_strategy. A dynamic table takes any id: a row is created with
// the table's initializer the first time it is pulled or pushed, on the
// shard a hash of the id picks. A dynamic table may have a row limit per
// shard: at the limit new ids are refused, or the least recently touched
// rows are evicted (OnRowLimit).
//
// Example (psd running on 127.0.0.1:2222):
//   ps::Client client(opts);
//   client.create_tables({{.name = "user", .dim = 16, .rows = 1000000,
//                          .optimizer = ps::RowOptimizerConfig::adagrad(0.05f),
//                          .init = ps::InitConfig::uniform(-0.05f, 0.05f, 1)},
//                         {.name = "ad", .dim = 16, .dynamic = true, .row_limit = 1 << 20,
//                          .on_limit = ps::OnRowLimit::kEvictLru}});
//   std::vector<int64_t> ids = {7, 42, 7};
//   std::vector<float> rows(ids.size() * 16);
//   client.pull_rows("user", ids, rows);             // rows[i*16 .. i*16+15] = row ids[i]
//   std::vector<float> grads(ids.size() * 16, 0.1f);
//   client.push_rows("user", ids, grads);            // row 7 gets the sum of its two gradients
#pragma once

#include <cstdint>
#include <string>

#include "ps/tensor_spec.h"

namespace ps {

// Where a fixed table's id lives (dynamic tables always hash the id).
enum class TablePlacement {
  kMod,   // shard = id % shards, local row = id / shards (TF's partition_strategy='mod')
  kDiv,   // contiguous ranges, the first rows % shards shards one row longer ('div')
  kHash,  // shard = a 64-bit mix of the id % shards (the only choice for dynamic tables)
};

enum class RowOptimizerKind { kSgd, kAdagrad, kLazyAdam, kFtrl };

// Applied per row, to the rows a push touches only (slots of other rows
// never move: LazyAdam's semantics).
struct RowOptimizerConfig {
  RowOptimizerKind kind = RowOptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float initial_accumulator =
      0.1f;                // Adagrad, FTRL (tf.train.FtrlOptimizer's initial_accumulator_value)
  float beta1 = 0.9f;      // LazyAdam
  float beta2 = 0.999f;    // LazyAdam
  float epsilon = 1e-7f;   // LazyAdam
  float l1 = 0.0f;         // FTRL l1_regularization_strength
  float l2 = 0.0f;         // FTRL l2_regularization_strength
  float lr_power = -0.5f;  // FTRL learning_rate_power (<= 0)

  static RowOptimizerConfig sgd(float lr) {
    return {.kind = RowOptimizerKind::kSgd, .learning_rate = lr};
  }
  static RowOptimizerConfig adagrad(float lr, float initial_accumulator = 0.1f) {
    return {.kind = RowOptimizerKind::kAdagrad,
            .learning_rate = lr,
            .initial_accumulator = initial_accumulator};
  }
  static RowOptimizerConfig lazy_adam(float lr, float beta1 = 0.9f, float beta2 = 0.999f,
                                      float epsilon = 1e-7f) {
    return {.kind = RowOptimizerKind::kLazyAdam,
            .learning_rate = lr,
            .beta1 = beta1,
            .beta2 = beta2,
            .epsilon = epsilon};
  }
  static RowOptimizerConfig ftrl(float lr, float l1 = 0.0f, float l2 = 0.0f,
                                 float initial_accumulator = 0.1f, float lr_power = -0.5f) {
    return {.kind = RowOptimizerKind::kFtrl,
            .learning_rate = lr,
            .initial_accumulator = initial_accumulator,
            .l1 = l1,
            .l2 = l2,
            .lr_power = lr_power};
  }
};

// What a dynamic table at its row limit does with a new id.
enum class OnRowLimit {
  kRefuse,    // the call fails with RequestError; the request (one shard's part of the
              // batch, or a piece of it) holding the new id applies nothing, but the
              // other shards' parts of the same call may be applied
  kEvictLru,  // the least recently pulled or pushed rows make room (counted as evictions)
};

struct TableSpec {
  std::string name{};
  uint32_t dim = 0;
  uint64_t rows = 0;                                // fixed tables: ids in [0, rows)
  bool dynamic = false;                             // any 64-bit id; rows created on first touch
  TablePlacement placement = TablePlacement::kMod;  // fixed tables; dynamic ones: kHash, always
  RowOptimizerConfig optimizer{};
  // Each row's initial values; zeros, constant, uniform, normal and
  // truncated normal. Random ones are drawn from (seed, id): a row starts
  // the same whichever shard holds it.
  InitConfig init{};
  uint64_t row_limit = 0;  // dynamic: most rows per shard (0: none)
  OnRowLimit on_limit = OnRowLimit::kRefuse;
  // Dynamic: admission by count. A new id gets a row at its min_count-th
  // push (0 or 1: at its first pull or push); until then its pulls read its
  // initial values, creating nothing, and its gradients are dropped
  // (counted as ids_filtered). For the long tail of ids seen once or twice,
  // which would take memory and learn little (word2vec's min_count,
  // PaddlePaddle's CountFilterEntry). At most 255.
  uint32_t min_count = 0;
  // The pushes are counted in a count-min sketch of 4 x count_sketch_width
  // one-byte counters per shard (rounded up to a power of two; 0: 1 << 22,
  // 16 MiB): it can count an id high when other ids share its counters,
  // admitting it early, never late. A width of about the distinct ids a
  // shard sees keeps early admissions to a few percent.
  uint32_t count_sketch_width = 0;
  // Dynamic: a row neither pulled nor pushed in the last expire_after_steps
  // global steps is dropped (counted as rows_expired; 0: never), so that a
  // table trained on a stream keeps the ids still seen, whatever its row
  // limit (Monolith's expire time, PaddlePaddle's shrink). Steps as the
  // job's TrainingSession counts them: a job that reports none expires
  // nothing. A lookup does not keep a row.
  uint64_t expire_after_steps = 0;
};

}  // namespace ps
