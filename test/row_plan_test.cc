// client/row_plan: a batch's ids deduplicated, grouped by shard and cut into
// requests; rows put back in the caller's order, and gradients summed per id,
// each checked against a plain std::map reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include "client/row_plan.h"

using namespace ps;

namespace {

std::vector<uint64_t> random_ids(std::size_t n, uint64_t range, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> ids(n);
  for (auto& id : ids) id = rng() % range;
  return ids;
}

// Answers each request of `plan` as psd would, with value(id, j) for a row's
// floats, scatters the replies and fills the repeats: every position must
// then hold its id's row. Returns the rows in the caller's order.
template <typename Value>
std::vector<float> check_rows_land(const RowPlan& plan, const std::vector<uint64_t>& ids,
                                   uint32_t dim, Value value) {
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
  return out;
}

// gather_gradients against a std::map of each id's summed gradients (small
// integers: exact in float).
void check_summed(const RowPlan& plan, const std::vector<uint64_t>& ids,
                  const std::vector<float>& grads, uint32_t dim) {
  std::map<uint64_t, std::vector<float>> sums;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto& s = sums[ids[i]];
    s.resize(dim);
    for (uint32_t j = 0; j < dim; ++j) s[j] += grads[i * dim + j];
  }
  std::vector<float> summed(plan.ids.size() * dim);
  gather_gradients(plan, grads.data(), dim, summed.data());
  for (std::size_t p = 0; p < plan.ids.size(); ++p) {
    for (uint32_t j = 0; j < dim; ++j) REQUIRE(summed[p * dim + j] == sums[plan.ids[p]][j]);
  }
  // What a push sends, request by request: the same values, from the
  // caller's own buffer where the plan keeps the caller's order.
  PushGradients sent(std::make_shared<const RowPlan>(plan), grads, dim);
  CHECK(sent.in_callers_buffer() == plan.in_caller_order);
  CHECK(sent.all_within(std::numeric_limits<float>::max()));
  for (const RowRequest& r : plan.requests) {
    std::vector<float> written(std::size_t(r.count) * dim);
    sent.write(r, written.data());
    const std::span<const float> rows = sent.rows(r);
    REQUIRE(rows.size() == written.size());
    CHECK((rows.data() == grads.data() + std::size_t(r.first) * dim) == plan.in_caller_order);
    for (std::size_t k = 0; k < written.size(); ++k) {
      REQUIRE(written[k] == summed[std::size_t(r.first) * dim + k]);
      REQUIRE(rows[k] == written[k]);
    }
    CHECK(sent.within(r, std::numeric_limits<float>::max()));
  }
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
      // `first` is each id's first position; each repeat names its id's
      // first position and index, and every position that is not an id's
      // first is a repeat, in caller order.
      std::map<uint64_t, uint32_t> first_seen;
      std::vector<uint32_t> later;
      for (uint32_t i = 0; i < ids.size(); ++i)
        if (!first_seen.emplace(ids[i], i).second) later.push_back(i);
      for (std::size_t p = 0; p < plan.ids.size(); ++p)
        REQUIRE(plan.first[p] == first_seen[plan.ids[p]]);
      REQUIRE(plan.repeats.size() == later.size());
      for (std::size_t k = 0; k < later.size(); ++k) {
        const RowRepeat& r = plan.repeats[k];
        REQUIRE(r.position == later[k]);
        REQUIRE(r.first == first_seen[ids[r.position]]);
        REQUIRE(plan.ids[r.index] == ids[r.position]);
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
    const std::vector<float> out = check_rows_land(plan, ids, dim, value);
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
  for (uint32_t shards : {1u, 2u}) {
    for (bool repeats : {true, false}) {
      INFO(shards << " shards, repeats " << repeats);
      std::vector<uint64_t> ids = random_ids(4000, repeats ? 500 : (1ull << 40), 3);
      const RowPlan plan =
          plan_rows(ids, RowPlacement(TablePlacement::kHash, 0, shards), 1000, false);
      REQUIRE(plan.has_duplicates == repeats);
      // Only one shard and no repeats leave the caller's order as it is.
      CHECK(plan.in_caller_order == (shards == 1 && !repeats));
      std::vector<float> grads(ids.size() * dim);
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(int(i % 9) - 4);
      check_summed(plan, ids, grads, dim);
    }
  }
}

TEST_CASE("a push's gradients: buffers reused, and refused where a row or a sum is out of bounds") {
  const uint32_t dim = 4;
  const std::vector<uint64_t> ids = {7, 3, 7, 9};  // a repeat: rows from a pooled buffer
  const auto plan = std::make_shared<const RowPlan>(
      plan_rows(ids, RowPlacement(TablePlacement::kHash, 0, 1), 2, false));
  REQUIRE(plan->requests.size() == 2);  // {7, 3}, {9}
  std::vector<float> grads(ids.size() * dim, 1.0f);
  const float* first = PushGradients(plan, grads, dim).rows(plan->requests[0]).data();
  PushGradients again(plan, grads, dim);  // the first's buffer, back in the pool
  const std::span<const float> rows = again.rows(plan->requests[0]);
  CHECK(rows.data() == first);
  CHECK(rows[0] == 2.0f);  // id 7's two rows
  CHECK(rows[dim] == 1.0f);

  const float big = 3e38f, limit = std::numeric_limits<float>::max();
  grads[0] = grads[2 * dim] = big;  // id 7's two gradients: each finite, their sum Inf
  PushGradients summed_inf(plan, grads, dim);
  CHECK(!summed_inf.all_within(limit));
  CHECK(!summed_inf.within(plan->requests[0], limit));
  CHECK(summed_inf.within(plan->requests[1], limit));
  grads[0] = grads[2 * dim] = 1.0f;
  grads[3 * dim + 1] = std::numeric_limits<float>::quiet_NaN();  // id 9's
  PushGradients nan(plan, grads, dim);
  CHECK(!nan.all_within(limit));
  CHECK(nan.within(plan->requests[0], limit));
  CHECK(!nan.within(plan->requests[1], limit));
  grads[3 * dim + 1] = 5.0f;  // within a limit of 8, not one of 4
  CHECK(PushGradients(plan, grads, dim).all_within(8.0f));
  CHECK(!PushGradients(plan, grads, dim).within(plan->requests[1], 4.0f));
}

namespace {

// What a plan must be, worked out the plain way: the distinct ids of each
// shard in first-seen order, shard after shard (a std::unordered_map gives
// each id's first position).
struct ReferencePlan {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> first;
  std::vector<RowRepeat> repeats;
  std::vector<RowRequest> requests;
};

ReferencePlan reference_plan(const std::vector<uint64_t>& ids, const RowPlacement& place,
                             uint32_t max_ids, bool every_shard) {
  std::unordered_map<uint64_t, uint32_t> first_of;
  std::vector<std::vector<uint32_t>> by_shard(place.shards());  // first positions
  ReferencePlan ref;
  for (uint32_t i = 0; i < ids.size(); ++i) {
    auto [it, added] = first_of.emplace(ids[i], i);
    if (added)
      by_shard[place.shard_of(ids[i])].push_back(i);
    else
      ref.repeats.push_back({i, it->second, 0});
  }
  std::unordered_map<uint64_t, uint32_t> index_of;
  for (uint32_t s = 0; s < place.shards(); ++s) {
    const auto begin = static_cast<uint32_t>(ref.ids.size());
    for (uint32_t f : by_shard[s]) {
      index_of[ids[f]] = static_cast<uint32_t>(ref.ids.size());
      ref.ids.push_back(ids[f]);
      ref.first.push_back(f);
    }
    const auto end = static_cast<uint32_t>(ref.ids.size());
    if (begin == end && every_shard) ref.requests.push_back({s, begin, 0});
    for (uint32_t f = begin; f < end; f += max_ids)
      ref.requests.push_back({s, f, std::min(max_ids, end - f)});
  }
  for (RowRepeat& r : ref.repeats) r.index = index_of[ids[r.position]];
  return ref;
}

void require_same(const RowPlan& plan, const ReferencePlan& ref) {
  REQUIRE(std::vector<uint64_t>(plan.ids.begin(), plan.ids.end()) == ref.ids);
  REQUIRE(std::vector<uint32_t>(plan.first.begin(), plan.first.end()) == ref.first);
  REQUIRE(plan.repeats == ref.repeats);
  REQUIRE(plan.has_duplicates == !ref.repeats.empty());
  REQUIRE(plan.requests.size() == ref.requests.size());
  for (std::size_t k = 0; k < ref.requests.size(); ++k) {
    REQUIRE(plan.requests[k].shard == ref.requests[k].shard);
    REQUIRE(plan.requests[k].first == ref.requests[k].first);
    REQUIRE(plan.requests[k].count == ref.requests[k].count);
  }
}

}  // namespace

TEST_CASE("plan_rows equals a std::unordered_map reference, with plans and scratch reused") {
  std::mt19937_64 rng(29);
  const uint64_t rows = 10'000'000;
  // Uniform, skewed (rows * u^3: a hot head), one id repeated, all distinct
  // and consecutive, ids over the whole 64 bits (hash placement only).
  auto batch = [&](int kind, std::size_t n) {
    std::vector<uint64_t> ids(n);
    std::uniform_real_distribution<double> u(0, 1);
    for (std::size_t i = 0; i < n; ++i) {
      switch (kind) {
        case 0:
          ids[i] = rng() % rows;
          break;
        case 1:
          ids[i] = std::min<uint64_t>(rows - 1, uint64_t(rows * std::pow(u(rng), 3)));
          break;
        case 2:
          ids[i] = 123457;
          break;
        case 3:
          ids[i] = i;
          break;
        default:
          ids[i] = rng();
          break;
      }
    }
    return ids;
  };
  RowPlan reused;  // one plan through every case: big batches, then small ones
  int checked = 0;
  for (std::size_t n : {65536u, 20000u, 1000u, 17u, 1u, 0u, 4096u}) {
    for (int kind = 0; kind < 5; ++kind) {
      for (TablePlacement placement :
           {TablePlacement::kMod, TablePlacement::kDiv, TablePlacement::kHash}) {
        if (kind == 4 && placement != TablePlacement::kHash) continue;
        for (uint32_t shards : {1u, 2u, 3u, 16u, 17u, 40u}) {
          for (bool every_shard : {false, true}) {
            INFO(n << " ids of kind " << kind << ", placement " << int(placement) << ", " << shards
                   << " shards, every_shard " << every_shard);
            const RowPlacement place(placement, rows, shards);
            const auto ids = batch(kind, n);
            const uint32_t max_ids = n > 1000 ? 3000 : 7;
            const ReferencePlan ref = reference_plan(ids, place, max_ids, every_shard);
            plan_rows_into(reused, ids, place, max_ids, every_shard);
            require_same(reused, ref);
            require_same(*shared_row_plan(ids, place, max_ids, every_shard), ref);
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked == 7 * (4 * 3 + 1) * 6 * 2);
}

TEST_CASE("rows and summed gradients of reused plans equal a reference's") {
  std::mt19937_64 rng(31);
  const uint32_t dim = 32;
  RowPlan plan;
  for (uint32_t shards : {1u, 3u, 20u}) {
    for (uint64_t range : {10'000'000ull, 3000ull}) {  // few repeats, then many
      INFO(shards << " shards, ids below " << range);
      std::vector<uint64_t> ids(20000);
      for (auto& id : ids) id = rng() % range;
      plan_rows_into(plan, ids, RowPlacement(TablePlacement::kMod, range, shards), 2500, false);
      auto value = [](uint64_t id, uint32_t j) { return float(id % 100000) * 64.0f + float(j); };
      check_rows_land(plan, ids, dim, value);
      // Gradients: small integers, so sums are exact in float.
      std::vector<float> grads(ids.size() * dim);
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(int(rng() % 9) - 4);
      REQUIRE(std::set<uint64_t>(ids.begin(), ids.end()).size() == plan.ids.size());
      check_summed(plan, ids, grads, dim);
    }
  }
}
