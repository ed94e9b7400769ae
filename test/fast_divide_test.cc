// common/fast_divide: FastDivider's quotient and remainder against the
// divide instruction, at the edges (0, d - 1, d, d + 1, 2^64 - 1, near
// multiples of d) and at random, for small, large and power-of-two divisors;
// and RowPlacement, which uses it, against the plain arithmetic of each
// placement.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "common/embedding_placement.h"
#include "common/fast_divide.h"

using namespace ps;

TEST_CASE("FastDivider gives what / and % give") {
  std::mt19937_64 rng(11);
  std::vector<uint64_t> divisors = {1,
                                    2,
                                    3,
                                    5,
                                    7,
                                    10,
                                    16,
                                    17,
                                    641,
                                    1000003,
                                    (1ull << 32) - 1,
                                    1ull << 32,
                                    (1ull << 32) + 1,
                                    (1ull << 63) - 1,
                                    1ull << 63,
                                    (1ull << 63) + 1,
                                    ~0ull - 1,
                                    ~0ull};
  for (int k = 0; k < 40; ++k) divisors.push_back(rng() >> (rng() % 64) | 1);
  for (uint64_t d : divisors) {
    INFO("divisor " << d);
    const FastDivider div(d);
    std::vector<uint64_t> xs = {0,         1,         d - 1,         d,
                                d + 1,     2 * d - 1, 2 * d,         ~0ull,
                                ~0ull - 1, ~0ull - d, ~0ull / d * d, ~0ull / d * d - 1};
    for (int k = 0; k < 2000; ++k) {
      xs.push_back(rng() >> (rng() % 64));
      const uint64_t m = d == 1 ? rng() : rng() % (~0ull / d + 1);  // near a multiple of d
      xs.push_back(m * d);
      xs.push_back(m * d + d - 1);
    }
    for (uint64_t x : xs) {
      uint64_t q = 0, r = 0;
      div.divide(x, q, r);
      REQUIRE(q == x / d);
      REQUIRE(r == x % d);
      REQUIRE(div.quotient(x) == x / d);
      REQUIRE(div.remainder(x) == x % d);
    }
  }
  CHECK(FastDivider(0).divisor() == 1);  // taken as 1
}

TEST_CASE("RowPlacement's shards and local rows are TensorFlow's mod and div, and a hash") {
  std::mt19937_64 rng(5);
  for (uint32_t shards : {1u, 2u, 3u, 7u, 16u, 40u}) {
    for (uint64_t rows : {1ull, 5ull, 39ull, 40ull, 41ull, 1000ull, 10000019ull}) {
      INFO(shards << " shards, " << rows << " rows");
      const RowPlacement mod(TablePlacement::kMod, rows, shards),
          div(TablePlacement::kDiv, rows, shards), hash(TablePlacement::kHash, rows, shards);
      // kDiv: the first rows % shards shards hold one row more.
      const uint64_t per = rows / shards, extra = rows % shards;
      std::vector<uint64_t> ids;
      for (uint64_t id = 0; id < std::min<uint64_t>(rows, 300); ++id) ids.push_back(id);
      for (int k = 0; k < 300; ++k) ids.push_back(rng() % rows);
      ids.push_back(rows - 1);
      for (uint64_t id : ids) {
        REQUIRE(mod.shard_of(id) == id % shards);
        REQUIRE(mod.local_row(id) == id / shards);
        REQUIRE(mod.global_id(mod.shard_of(id), mod.local_row(id)) == id);
        const uint64_t s =
            id < extra * (per + 1) ? id / (per + 1) : extra + (id - extra * (per + 1)) / per;
        REQUIRE(div.shard_of(id) == s);
        REQUIRE(div.local_row(id) < div.rows_on(div.shard_of(id)));
        REQUIRE(div.global_id(div.shard_of(id), div.local_row(id)) == id);
      }
      for (int k = 0; k < 300; ++k) {
        const uint64_t id = rng();
        REQUIRE(hash.shard_of(id) == mix_id(id) % shards);
      }
    }
  }
}
