#include <catch2/catch.hpp>

#include <set>

#include "ps/errors.h"
#include "ps/placement.h"
#include "client/request_plan.h"

using namespace ps;

namespace {
TensorSpec t(std::string name, std::vector<uint64_t> shape) {
  return TensorSpec{.name = std::move(name), .shape = std::move(shape)};
}
}  // namespace

TEST_CASE("round-robin follows declaration order like replica_device_setter") {
  Placement p(3, PlacementPolicy::kRoundRobin);
  for (auto name : {"a", "b", "c", "d", "e"}) p.add(t(name, {10}));
  CHECK(p.parts_of("a")[0].shard == 0);
  CHECK(p.parts_of("b")[0].shard == 1);
  CHECK(p.parts_of("c")[0].shard == 2);
  CHECK(p.parts_of("d")[0].shard == 0);
  CHECK(p.parts_of("e")[0].shard == 1);
  CHECK(p.parts_of("e")[0].stored_name == "e");
}

TEST_CASE("greedy placement balances bytes") {
  Placement p(2, PlacementPolicy::kGreedyBytes);
  p.add(t("big", {1000}));
  p.add(t("s1", {100}));
  p.add(t("s2", {100}));
  p.add(t("s3", {700}));
  CHECK(p.parts_of("big")[0].shard == 0);
  CHECK(p.parts_of("s1")[0].shard == 1);
  CHECK(p.parts_of("s2")[0].shard == 1);
  CHECK(p.parts_of("s3")[0].shard == 1);
  CHECK(p.shard_bytes(0) == 4000);
  CHECK(p.shard_bytes(1) == 3600);
}

TEST_CASE("tensors over the chunk size are split into parts covering them exactly") {
  Placement p(3, PlacementPolicy::kRoundRobin, /*chunk_bytes=*/400);  // 100 floats per part
  p.add(t("x", {7}));
  const auto& parts = p.add(t("big", {25, 10})).parts;  // 250 floats: 100 + 100 + 50
  REQUIRE(parts.size() == 3);
  uint64_t next = 0;
  std::set<int> shards;
  for (const Part& part : parts) {
    CHECK(part.offset == next);
    CHECK(part.num_parts == 3);
    CHECK(part.stored_name == "big/part_" + std::to_string(part.index));
    next += part.count;
    shards.insert(part.shard);
  }
  CHECK(next == 250);
  CHECK(parts.back().count == 50);
  CHECK(shards.size() == 3);   // spread over all shards
  CHECK(parts[0].shard == 1);  // round-robin continues after "x"
}

TEST_CASE("chunks are stored in parts that share the chunk's shard") {
  // chunks of 100 floats, parts of 40: 250 floats = [40 40 20] [40 40 20] [40 10]
  Placement p(3, PlacementPolicy::kRoundRobin, /*chunk_bytes=*/400, /*part_bytes=*/160);
  const auto& parts = p.add(t("big", {250})).parts;
  REQUIRE(parts.size() == 8);
  const std::vector<uint64_t> counts = {40, 40, 20, 40, 40, 20, 40, 10};
  const std::vector<int> shards = {0, 0, 0, 1, 1, 1, 2, 2};
  uint64_t next = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    CHECK(parts[i].index == i);
    CHECK(parts[i].num_parts == 8);
    CHECK(parts[i].offset == next);
    CHECK(parts[i].count == counts[i]);
    CHECK(parts[i].shard == shards[i]);
    next += parts[i].count;
  }
  CHECK(p.shard_bytes(0) == 400);
  CHECK(p.shard_bytes(2) == 200);
  // A tensor within one part is not split; one within a chunk stays on one shard.
  CHECK(p.add(t("small", {40})).parts.size() == 1);
  const auto& mid = p.add(t("mid", {90})).parts;
  REQUIRE(mid.size() == 3);
  CHECK((mid[0].shard == mid[1].shard && mid[1].shard == mid[2].shard));
}

TEST_CASE("the defaults: 4 MiB chunks over the shards, stored in 1 MiB parts") {
  Placement p(3, PlacementPolicy::kGreedyBytes);
  const auto& parts = p.add(t("w", {10u << 18})).parts;  // 10 MiB
  REQUIRE(parts.size() == 10);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    CHECK(parts[i].count * sizeof(float) == kDefaultPartBytes);
    CHECK(parts[i].shard == static_cast<int>(i / 4));
  }
  CHECK(p.shard_bytes(0) == kDefaultChunkBytes);
  CHECK(p.shard_bytes(2) == 2 * kDefaultPartBytes);
  // Greedy by bytes picks per chunk: the next tensor goes to the lightest shard.
  CHECK(p.add(t("b", {16})).parts[0].shard == 2);
  CHECK_THROWS_AS(Placement(1, PlacementPolicy::kRoundRobin, 400, 0), ConfigError);
}

TEST_CASE("declaring a name twice keeps the first placement or refuses a new shape") {
  Placement p(2, PlacementPolicy::kRoundRobin);
  p.add(t("a", {4}));
  CHECK(p.add(t("a", {4})).parts[0].shard == 0);
  CHECK(p.tensors().size() == 1);
  CHECK_THROWS_AS(p.add(t("a", {5})), ConfigError);
  CHECK_THROWS_AS(p.add(t("", {5})), ConfigError);
  CHECK_THROWS_AS(p.add(t("z", {0})), ConfigError);
  CHECK_THROWS_AS(p.at("nope"), ConfigError);
  CHECK_THROWS_AS(Placement(0, PlacementPolicy::kRoundRobin), ConfigError);
}

TEST_CASE("requests are grouped per shard and cut under the message limit") {
  Placement p(2, PlacementPolicy::kRoundRobin, /*chunk_bytes=*/400);
  p.add(t("a", {250}));  // parts on shards 0, 1, 0
  p.add(t("b", {10}));   // shard 1
  auto batches = plan_batches(p, {"a", "b"}, /*max_batch_bytes=*/800);
  uint64_t total = 0;
  for (const auto& b : batches) {
    CHECK(b.bytes <= 800);
    for (const auto& ref : b.parts) {
      CHECK(ref.part.shard == b.shard);
      total += ref.part.count;
    }
  }
  CHECK(total == 260);
  auto small = plan_batches(p, {"a"}, /*max_batch_bytes=*/400);
  CHECK(small.size() == 3);  // one part per message
  CHECK_THROWS_AS(plan_batches(p, {"a", "a"}, 800), ConfigError);
  CHECK_THROWS_AS(plan_batches(p, {"c"}, 800), ConfigError);
  // A create carries what it restores: values and two slots make a's parts
  // three times their size; b with no values costs only its spec.
  auto create = plan_batches(p, {"a", "b"}, /*max_batch_bytes=*/1500, {3, 0});
  for (const auto& b : create) {
    uint64_t bytes = 0;
    for (const auto& ref : b.parts) {
      // The values it carries, and its names (the tensor's twice, the
      // part's) and shape beside the fixed cost.
      bytes += ref.part.count * 4 * (ref.tensor == 0 ? 3 : 0) + kPartOverheadBytes + 2 * 1 + 8 * 1 +
               ref.part.stored_name.size();
    }
    CHECK(b.bytes == bytes);
    CHECK((b.bytes <= 1500 || b.parts.size() == 1));
  }
  CHECK(create.size() == 4);  // a part of a with its copies takes 1456 bytes: none has company
}

TEST_CASE("a request's size counts the names it carries") {
  Placement p(1, PlacementPolicy::kRoundRobin);
  const std::string long_name(500, 'n');
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) {
    names.push_back(long_name + std::to_string(i));
    p.add(t(names.back(), {1}));
  }
  // 40 one-float tensors with 500-character names: with 256 bytes a part
  // counted for all but the values, they went as one request of ~40 KB
  // counted as ~10 KB (4000 of them broke a 2 MiB message limit).
  for (const auto& b : plan_batches(p, names, /*max_batch_bytes=*/16 << 10)) {
    uint64_t names_bytes = 0;
    for (const auto& ref : b.parts)
      names_bytes += 2 * names[ref.tensor].size() + ref.part.stored_name.size();
    CHECK(names_bytes <= (16u << 10));
  }
}

TEST_CASE(
    "shapes whose counts would wrap, and names that clash with parts or run long, are refused") {
  Placement p(2, PlacementPolicy::kRoundRobin);
  // Before: 2^64-1 elements were placed in 0 parts, and a create "succeeded".
  CHECK(t("x", {~uint64_t{0}}).num_elements() == ~uint64_t{0});
  CHECK(t("x", {3, uint64_t{1} << 63}).num_elements() ==
        ~uint64_t{0});  // saturates, no wrap to a small count
  CHECK(t("x", {uint64_t{1} << 63, 0}).num_elements() == 0);
  CHECK_THROWS_WITH(p.add(t("x", {~uint64_t{0}})), Catch::Contains("more than 2^61 elements"));
  CHECK_THROWS_WITH(p.add(t("x", {uint64_t{1} << 32, uint64_t{1} << 32})),
                    Catch::Contains("more than 2^61 elements"));
  // 2^50 floats in 1 MiB parts: 2^32 parts, refused before anything is allocated.
  CHECK_THROWS_WITH(p.add(t("x", {uint64_t{1} << 50})),
                    Catch::Contains("parts") && Catch::Contains("part_bytes"));
  // Names psd stores split tensors' parts under.
  CHECK_THROWS_WITH(p.add(t("w/part_5", {4})), Catch::Contains("kept for the parts"));
  CHECK_NOTHROW(p.add(t("w/part_", {4})));
  CHECK_NOTHROW(p.add(t("w/part_5x", {4})));
  CHECK_NOTHROW(p.add(t("w/partition_5", {4})));
  // A name that fits psd's 512 characters alone, but not with "/part_<i>".
  CHECK_NOTHROW(p.add(t(std::string(512, 'a'), {4})));
  CHECK_THROWS_WITH(p.add(t(std::string(505, 'b'), {3u << 20})), Catch::Contains("shorten it"));
  CHECK(p.tensors().size() == 4);
}

TEST_CASE(
    "a placement rolled back to a mark places the next tensors as if the later ones never came") {
  Placement p(3, PlacementPolicy::kRoundRobin, /*chunk_bytes=*/400);
  p.add(t("a", {10}));
  const auto mark = p.mark();
  p.add(t("b", {250}));  // three chunks: the round robin moves on three
  p.add(t("c", {10}));
  p.rollback(mark);
  CHECK_FALSE(p.contains("b"));
  CHECK_FALSE(p.contains("c"));
  CHECK(p.tensors().size() == 1);
  for (int s = 0; s < 3; ++s) CHECK(p.shard_bytes(s) == (s == 0 ? 40u : 0u));
  p.add(t("b", {20}));  // another shape is fine now
  Placement fresh(3, PlacementPolicy::kRoundRobin, 400);
  fresh.add(t("a", {10}));
  fresh.add(t("b", {20}));
  CHECK(p.at("b").parts[0].shard == fresh.at("b").parts[0].shard);
}
