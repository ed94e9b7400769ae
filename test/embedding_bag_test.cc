// The CPU embedding bag against the float64 reference; id deduplication.
#include <map>
#include <random>

#include <catch2/catch.hpp>

#include "test/embedding_bag_checks.h"

using namespace emb_test;

namespace {
const Forward kForward = [](auto rows, int dim, auto offsets, auto index, ps::BagCombiner c,
                            auto out) {
  ps::embedding_bag_forward(rows, dim, offsets, index, c, out);
};
const Backward kBackward = [](auto grad_out, int dim, auto offsets, auto index, ps::BagCombiner c,
                              auto grad_rows) {
  ps::embedding_bag_backward(grad_out, dim, offsets, index, c, grad_rows);
};
}  // namespace

TEST_CASE("dedup_ids keeps first-appearance order and maps every position", "[embedding_bag]") {
  const std::vector<uint64_t> ids{42, 7, 42, ~0ull, 7, 0, 42};
  const ps::UniqueIds u = ps::dedup_ids(ids);
  CHECK(u.ids == std::vector<uint64_t>{42, 7, ~0ull, 0});
  CHECK(u.index == std::vector<int32_t>{0, 1, 0, 2, 1, 3, 0});
  const ps::UniqueIds empty = ps::dedup_ids({});
  CHECK(empty.ids.empty());
  CHECK(empty.index.empty());
}

TEST_CASE("dedup_ids_into reuses its vectors and matches a map on large batches",
          "[embedding_bag]") {
  std::mt19937_64 rng(11);
  ps::UniqueIds u;
  // Batches that shrink and grow, ids from a range small enough to repeat
  // often, some spread over all 64 bits: each against a std::map reference.
  for (std::size_t n : {20000u, 3u, 50000u, 0u, 777u}) {
    std::vector<uint64_t> ids(n);
    for (auto& id : ids) id = rng() % 3 == 0 ? rng() : rng() % (n / 4 + 1);
    ps::dedup_ids_into(ids, u);
    std::map<uint64_t, int32_t> first;
    std::vector<uint64_t> order;
    REQUIRE(u.index.size() == n);
    for (std::size_t j = 0; j < n; ++j) {
      auto [it, fresh] = first.try_emplace(ids[j], static_cast<int32_t>(order.size()));
      if (fresh) order.push_back(ids[j]);
      REQUIRE(u.index[j] == it->second);
    }
    CHECK(u.ids == order);
  }
}

TEST_CASE("fixed_offsets", "[embedding_bag]") {
  CHECK(ps::fixed_offsets(3, 2) == std::vector<int64_t>{0, 2, 4, 6});
  CHECK(ps::fixed_offsets(0, 5) == std::vector<int64_t>{0});
  CHECK_THROWS_AS(ps::fixed_offsets(-1, 1), ps::Error);
}

TEST_CASE("CPU embedding bag matches the float64 reference, repeated ids summed",
          "[embedding_bag]") {
  check_against_reference(kForward, kBackward, 1, 1, 1, 1, 1);       // one bag, one id
  check_against_reference(kForward, kBackward, 7, 16, 5, 6, 2);      // heavy repetition, empty bags
  check_against_reference(kForward, kBackward, 100, 3, 1000, 3, 3);  // mostly distinct ids, odd dim
  check_against_reference(kForward, kBackward, 512 * 26, 16, 20000, 1,
                          4);  // wide & deep: one id per field
  check_against_reference(kForward, kBackward, 300, 64, 50, 40, 5);  // long bags
  // Every row size with its own compiled loops (1, 8, 16, 32, 64) and two
  // without (3 above, 100): bags of zero, one and many rows.
  check_against_reference(kForward, kBackward, 200, 1, 100, 30, 6);  // the wide part's bags
  check_against_reference(kForward, kBackward, 150, 8, 60, 5, 7);
  check_against_reference(kForward, kBackward, 150, 32, 60, 5, 8);
  check_against_reference(kForward, kBackward, 60, 100, 40, 4, 9);
}

TEST_CASE("CPU embedding bag: one id per bag is a gather, backward a scatter-add",
          "[embedding_bag]") {
  // rows (2, 2); bags: [1], [0], [1] -> out = rows[1], rows[0], rows[1]
  const std::vector<float> rows{1, 2, 3, 4};
  const std::vector<int64_t> offsets = ps::fixed_offsets(3, 1);
  const std::vector<int32_t> index{1, 0, 1};
  std::vector<float> out(6);
  ps::embedding_bag_forward(rows, 2, offsets, index, ps::BagCombiner::kMean, out);
  CHECK(out == std::vector<float>{3, 4, 1, 2, 3, 4});
  const std::vector<float> grad_out{1, 10, 100, 1000, 0.5f, 0.25f};
  std::vector<float> grad_rows(4, 99.0f);
  ps::embedding_bag_backward(grad_out, 2, offsets, index, ps::BagCombiner::kSum, grad_rows);
  CHECK(grad_rows == std::vector<float>{100, 1000, 1.5f, 10.25f});
}

TEST_CASE("CPU embedding bag refuses bad input and writes nothing", "[embedding_bag]") {
  check_bad_input(kForward, kBackward);
}
