// What must hold of a shard after any input, accepted or refused
// (docs/hardening.md): every stored value and optimizer slot is finite, and
// every stored name passes check_name. Traps (a fuzzer finding) otherwise.
#pragma once

#include <cmath>
#include <cstdio>

#include "common/tensor_name.h"
#include "ps/errors.h"
#include "server/shard.h"

namespace ps::fuzz {

inline void check_shard_invariants(Shard& shard) {
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
