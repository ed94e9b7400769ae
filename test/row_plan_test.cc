// client/row_plan: a batch's ids deduplicated, grouped by shard and cut into
// requests; rows put back in the caller's order, and gradients summed per id,
// each checked against a plain std::map reference.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "client/row_plan.h"

using namespace ps;

namespace {

std::vector<uint64_t> random_ids(std::size_t n, uint64_t range, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> ids(n);
  for (auto& id : ids) id = rng() % range;
  return ids;
}

}  // namespace

TEST_CASE("plan_rows: distinct ids grouped by shard, in requests of at most max_ids") {
  for (TablePlacement kind : {TablePlacement::kMod, TablePlacement::kDiv, TablePlacement::kHash}) {
    for (uint32_t shards : {1u, 3u}) {
      INFO("placement " << int(kind) << ", " << shards << " shards");
      const uint64_t rows = 5000;
      RowPlacement place(kind, rows, shards);
      const auto ids = random_ids(20000, rows, 7 + shards);  // most ids repeat
      const RowPlan plan = plan_rows(ids, place, 300, false);
      std::set<uint64_t> want(ids.begin(), ids.end());
      REQUIRE(plan.ids.size() == want.size());
      REQUIRE(std::set<uint64_t>(plan.ids.begin(), plan.ids.end()) == want);
      CHECK(plan.has_duplicates);
      // Each position points at its id; `first` is each id's first position.
      std::map<uint64_t, uint32_t> first_seen;
      for (uint32_t i = 0; i < ids.size(); ++i) {
        REQUIRE(plan.ids[plan.position[i]] == ids[i]);
        first_seen.emplace(ids[i], i);
      }
      for (std::size_t p = 0; p < plan.ids.size(); ++p)
        REQUIRE(plan.first[p] == first_seen[plan.ids[p]]);
      CHECK(plan.repeats.size() == ids.size() - want.size());
      for (auto [position, first] : plan.repeats) {
        REQUIRE(ids[position] == ids[first]);
        REQUIRE(first == first_seen[ids[position]]);
      }
      // The requests cover the plan once, in order, each within one shard.
      uint32_t next = 0;
      for (const RowRequest& r : plan.requests) {
        REQUIRE(r.first == next);
        REQUIRE(r.count >= 1);
        REQUIRE(r.count <= 300);
        for (uint32_t k = r.first; k < r.first + r.count; ++k)
          REQUIRE(place.shard_of(plan.ids[k]) == r.shard);
        next += r.count;
      }
      CHECK(next == plan.ids.size());
    }
  }
}

TEST_CASE("plan_rows: every_shard gives a shard with no ids an empty request") {
  RowPlacement place(TablePlacement::kMod, 100, 4);
  const std::vector<uint64_t> ids = {0, 4, 8, 2};  // shards 0 and 2 only
  const RowPlan plan = plan_rows(ids, place, 100, true);
  std::map<uint32_t, uint32_t> per_shard;
  for (const RowRequest& r : plan.requests) per_shard[r.shard] += r.count + 1000;
  CHECK(per_shard == std::map<uint32_t, uint32_t>{{0, 1003}, {1, 1000}, {2, 1001}, {3, 1000}});
  CHECK_FALSE(plan.has_duplicates);
  CHECK(plan.repeats.empty());
}

TEST_CASE("rows come back in the caller's order, however the replies are split") {
  for (uint32_t dim : {3u, 8u, 16u, 32u, 64u}) {
    INFO("dim " << dim);
    const auto ids = random_ids(3000, 1000, dim);
    const RowPlan plan = plan_rows(ids, RowPlacement(TablePlacement::kHash, 0, 3), 97, false);
    // What psd sends for a row: values made from its id.
    auto value = [](uint64_t id, uint32_t j) { return float(id) * 100.0f + float(j); };
    std::vector<float> out(ids.size() * dim, -1.0f);
    for (const RowRequest& r : plan.requests) {
      std::vector<float> reply(std::size_t(r.count) * dim);
      for (uint32_t k = 0; k < r.count; ++k)
        for (uint32_t j = 0; j < dim; ++j) reply[k * dim + j] = value(plan.ids[r.first + k], j);
      scatter_request(plan, r, reply.data(), dim, out.data());
    }
    fill_repeats(plan, dim, out.data());
    for (std::size_t i = 0; i < ids.size(); ++i)
      for (uint32_t j = 0; j < dim; ++j) REQUIRE(out[i * dim + j] == value(ids[i], j));
    // The same from one buffer in plan order.
    std::vector<float> rows(plan.ids.size() * dim), out2(ids.size() * dim);
    for (std::size_t p = 0; p < plan.ids.size(); ++p)
      for (uint32_t j = 0; j < dim; ++j) rows[p * dim + j] = value(plan.ids[p], j);
    scatter_rows(plan, rows.data(), dim, out2.data());
    CHECK(out2 == out);
  }
}

TEST_CASE("gradients of repeated ids are summed; without repeats they are moved") {
  const uint32_t dim = 5;
  for (bool repeats : {true, false}) {
    INFO("repeats " << repeats);
    std::vector<uint64_t> ids = random_ids(4000, repeats ? 500 : (1ull << 40), 3);
    const RowPlan plan = plan_rows(ids, RowPlacement(TablePlacement::kHash, 0, 2), 1000, false);
    REQUIRE(plan.has_duplicates == repeats);
    std::vector<float> grads(ids.size() * dim);
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(int(i % 9) - 4);
    std::map<uint64_t, std::vector<float>> sums;  // small integers: exact in float
    for (std::size_t i = 0; i < ids.size(); ++i) {
      auto& s = sums[ids[i]];
      s.resize(dim);
      for (uint32_t j = 0; j < dim; ++j) s[j] += grads[i * dim + j];
    }
    std::vector<float> summed(plan.ids.size() * dim);
    gather_gradients(plan, grads.data(), dim, summed.data());
    for (std::size_t p = 0; p < plan.ids.size(); ++p)
      for (uint32_t j = 0; j < dim; ++j) REQUIRE(summed[p * dim + j] == sums[plan.ids[p]][j]);
  }
}
