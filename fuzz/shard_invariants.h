// What must hold of a shard after any input, accepted or refused
// (docs/hardening.md): every stored value and optimizer slot is finite, and
// every stored name passes check_name; the same for embedding tables' rows,
// slots and names. Traps (a fuzzer finding) otherwise.
#pragma once

#include <cmath>
#include <cstdio>

#include "common/checkpoint/checkpoint_file.h"
#include "common/tensor_name.h"
#include "fuzz/shard_env.h"
#include "ps/errors.h"
#include "server/shard.h"

namespace ps::fuzz {

// The shard's tables as a checkpoint holds them: every row, its slots.
inline std::vector<TableCheckpoint> table_rows(Shard& shard) {
  auto c = shard.snapshot().wait(io().waitScope);
  return std::move(c->tables);
}

inline void check_shard_invariants(Shard& shard) {
  for (const TableCheckpoint& t : table_rows(shard)) {
    try {
      check_name(t.spec.name, "stored table");
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      __builtin_trap();
    }
    if (shard.options().allow_nonfinite) continue;
    bool finite = true;
    for (float x : t.values) finite = finite && std::isfinite(x);
    for (const auto& slot : t.slots)
      for (float x : slot) finite = finite && std::isfinite(x);
    if (!finite) {
      std::fprintf(stderr, "table '%s' stores a non-finite value or slot\n", t.spec.name.c_str());
      __builtin_trap();
    }
  }
  for (StoredTensor* t : shard.store().all()) {
    try {
      check_name(t->spec().name, "stored tensor");
      if (t->part()) check_name(t->part()->full_name, "stored split tensor");
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      __builtin_trap();
    }
    if (shard.options().allow_nonfinite) continue;
    const StoredTensor::Snapshot s = t->snapshot();
    for (float x : s.values) {
      if (!std::isfinite(x)) {
        std::fprintf(stderr, "tensor '%s' stores a non-finite value\n", t->spec().name.c_str());
        __builtin_trap();
      }
    }
    for (const auto& slot : s.slots) {
      for (float x : slot) {
        if (!std::isfinite(x)) {
          std::fprintf(stderr, "tensor '%s' stores a non-finite slot value\n",
                       t->spec().name.c_str());
          __builtin_trap();
        }
      }
    }
  }
}

}  // namespace ps::fuzz
