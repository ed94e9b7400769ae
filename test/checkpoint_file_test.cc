// Checkpoint files: round trip, every kind of damage detected (never
// loaded), pruning, and reassembly of split tensors from several shards.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "common/checkpoint/checkpoint_file.h"
#include "ps/summary_writer.h"  // crc32c, mask_crc: the record checksums
#include "test/psd_process.h"

using namespace ps;
using ps::test::TempDir;

namespace {

ShardCheckpoint sample(uint32_t shard = 0, uint32_t shards = 1, int64_t step = 7) {
  ShardCheckpoint c;
  c.shard_index = shard;
  c.num_shards = shards;
  c.global_step = step;
  c.job_configured = true;
  c.job = {
      .mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 3, .train_steps = 100};
  c.ready = true;
  c.unix_secs = 1234.5;
  c.requests[1] = {{42, 6, {1, 1}}, {43, 7, {2}}};
  c.requests[-1] = {{50, 2, {1}}};                  // clients that gave no client id
  c.client_requests[0xfeedbeefull] = {{77, 5, {1}}};  // a client without a worker index
  TensorCheckpoint t;
  t.spec = {.name = "w", .shape = {2, 3}, .optimizer = OptimizerConfig::adam(0.1f)};
  t.version = 9;
  t.values = {1, 2, 3, 4, 5, 6};
  t.slots = {{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, {6, 5, 4, 3, 2, 1}};
  c.tensors.push_back(t);
  TensorCheckpoint b;
  b.spec = {.name = "b", .shape = {1}, .trainable = false};
  b.values = {-1};
  c.tensors.push_back(b);
  TableCheckpoint e;  // a dynamic table whose rows expire: each row's age too
  e.spec = {.name = "e",
            .dim = 2,
            .dynamic = true,
            .placement = TablePlacement::kHash,
            .optimizer = RowOptimizerConfig::adagrad(0.1f),
            .expire_after_steps = 10};
  e.shard_index = shard;
  e.num_shards = shards;
  e.version = 4;
  e.ids = {5, 9, 1ull << 63};
  e.values = {1, 2, 3, 4, 5, 6};
  e.slots = {{0.5f, 0.5f, 1, 1, 2, 2}};
  e.ages = {3, 0, 12};
  e.spec.min_count = 3;  // its count sketch too
  e.sketch_key = 0x5eed5eed5eedull;
  e.sketch_width = 64;
  e.sketch.resize(4 * 64);
  for (std::size_t i = 0; i < e.sketch.size(); ++i) e.sketch[i] = static_cast<uint8_t>(i * 7);
  c.tables.push_back(e);
  return c;
}

// The file with its header's format version set to `version` (and its checksum to match).
std::string with_format_version(std::string file, uint32_t version) {
  std::memcpy(file.data() + 8, &version, 4);
  const uint32_t crc = mask_crc(crc32c(file.data(), 12));
  std::memcpy(file.data() + 12, &crc, 4);
  return file;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace

TEST_CASE("a checkpoint file round-trips everything it holds") {
  TempDir dir;
  const std::string path = write_checkpoint(dir.path(), sample());
  CHECK(path == dir.path() + "/shard-0-of-1/ckpt-000000000007.psckpt");
  ShardCheckpoint c = read_checkpoint(path);
  CHECK(c.global_step == 7);
  CHECK(c.job.replicas_to_aggregate == 2);
  CHECK(c.job.train_steps == 100);
  CHECK(c.ready);
  CHECK(c.requests.at(1).size() == 2);
  CHECK(c.requests.at(1)[1].id == 43);
  CHECK(c.requests.at(1)[0].statuses == std::vector<uint8_t>{1, 1});
  CHECK(c.requests.at(-1).at(0).id == 50);
  REQUIRE(c.client_requests.size() == 1);
  CHECK(c.client_requests.at(0xfeedbeefull).at(0).id == 77);
  CHECK(c.client_requests.at(0xfeedbeefull).at(0).step == 5);
  REQUIRE(c.tensors.size() == 2);
  CHECK(c.tensors[0].spec.name == "w");
  CHECK(c.tensors[0].spec.optimizer.kind == OptimizerKind::kAdam);
  CHECK(c.tensors[0].version == 9);
  CHECK(c.tensors[0].values == sample().tensors[0].values);
  CHECK(c.tensors[0].slots == sample().tensors[0].slots);
  CHECK_FALSE(c.tensors[1].spec.trainable);
  REQUIRE(c.tables.size() == 1);
  CHECK(c.tables[0].spec.expire_after_steps == 10);
  CHECK(c.tables[0].version == 4);
  CHECK(c.tables[0].ids == sample().tables[0].ids);
  CHECK(c.tables[0].values == sample().tables[0].values);
  CHECK(c.tables[0].slots == sample().tables[0].slots);
  CHECK(c.tables[0].ages == std::vector<uint32_t>{3, 0, 12});
  CHECK(c.tables[0].spec.min_count == 3);
  CHECK(c.tables[0].sketch_key == 0x5eed5eed5eedull);
  CHECK(c.tables[0].sketch_width == 64);
  CHECK(c.tables[0].sketch == sample().tables[0].sketch);
  // No temp file is left behind.
  CHECK(list_checkpoints(dir.path(), 0, 1).size() == 1);
  CHECK(access((path + ".tmp").c_str(), F_OK) != 0);
}

TEST_CASE("damaged checkpoint files are refused with the reason") {
  TempDir dir;
  const std::string path = write_checkpoint(dir.path(), sample());
  const std::string good = slurp(path);
  auto refused = [&](const std::string& bytes) -> std::string {
    spit(path, bytes);
    try {
      read_checkpoint(path);
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "accepted";
  };
  SECTION("any flipped byte") {
    for (std::size_t i = 0; i < good.size(); i += 7) {
      std::string bad = good;
      bad[i] ^= 0x20;
      const std::string why = refused(bad);
      INFO("byte " << i << ": " << why);
      CHECK(why != "accepted");
      CHECK_THAT(why, Catch::Contains(path));
    }
  }
  SECTION("truncation anywhere") {
    for (std::size_t n = 0; n < good.size(); n += 5) {
      const std::string why = refused(good.substr(0, n));
      INFO("cut at " << n << ": " << why);
      CHECK(why != "accepted");
    }
    CHECK_THAT(refused(good.substr(0, good.size() - 3)), Catch::Contains("truncated"));
  }
  SECTION("a wrong magic or a newer format version") {
    CHECK_THAT(refused("hello world, not a checkpoint at all"), Catch::Contains("bad magic"));
    std::string newer = good;
    newer[8] = 3;  // format version (the header checksum catches it first)
    CHECK_THAT(refused(newer), Catch::Contains("header checksum"));
    CHECK_THAT(refused(with_format_version(good, 3)),
               Catch::Contains("format version 3, this build reads versions 1 to 2"));
    CHECK_THAT(refused(with_format_version(good, 0)), Catch::Contains("format version 0"));
  }
  SECTION("ages that do not match the rows, or a count sketch of another width") {
    ShardCheckpoint c = sample();
    c.tables[0].ages.pop_back();
    CHECK_THROWS_WITH(write_checkpoint(dir.path(), c), Catch::Contains("wrong number of row ages"));
    c = sample();
    c.tables[0].sketch.pop_back();
    CHECK_THROWS_WITH(write_checkpoint(dir.path(), c),
                      Catch::Contains("count sketch of the wrong size"));
  }
  SECTION("trailing garbage") { CHECK_THAT(refused(good + "xx"), Catch::Contains("trailing")); }
  SECTION("a global step psd could not count from") {
    for (int64_t step : {int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
      ShardCheckpoint c = sample();
      c.global_step = step;
      spit(path, slurp(write_checkpoint(dir.path(), c)));
      CHECK_THAT(refused(slurp(path)), Catch::Contains("out of range"));
    }
  }
}

TEST_CASE("a file of format version 1 (before row ages) is read, its rows without ages") {
  TempDir dir;
  ShardCheckpoint c = sample();
  c.tables[0].ages.clear();  // what a version 1 file holds
  c.tables[0].sketch_width = 0;
  c.tables[0].sketch.clear();
  const std::string path = write_checkpoint(dir.path(), c);
  spit(path, with_format_version(slurp(path), 1));
  const ShardCheckpoint back = read_checkpoint(path);
  REQUIRE(back.tables.size() == 1);
  CHECK(back.tables[0].ids == c.tables[0].ids);
  CHECK(back.tables[0].values == c.tables[0].values);
  CHECK(back.tables[0].ages.empty());
  CHECK(back.tables[0].sketch_width == 0);
}

TEST_CASE("pruning keeps the newest files of one shard only") {
  TempDir dir;
  for (int64_t step : {1, 5, 3, 12, 8}) write_checkpoint(dir.path(), sample(0, 2, step));
  write_checkpoint(dir.path(), sample(1, 2, 1));
  spit(dir.path() + "/shard-0-of-2/ckpt-000000000099.psckpt.tmp", "partial");
  prune_checkpoints(dir.path(), 0, 2, 3);
  auto files = list_checkpoints(dir.path(), 0, 2);
  REQUIRE(files.size() == 3);
  CHECK(files[0].step == 12);
  CHECK(files[1].step == 8);
  CHECK(files[2].step == 5);
  CHECK(list_checkpoints(dir.path(), 1, 2).size() == 1);
  CHECK(access((dir.path() + "/shard-0-of-2/ckpt-000000000099.psckpt.tmp").c_str(), F_OK) != 0);
}

TEST_CASE("a checkpoint at any step a job reaches, up to kMaxStep (19 digits), is found again") {
  TempDir dir;
  for (int64_t step : {int64_t{7}, int64_t{999999999999999999}, ps::kMaxStep})
    write_checkpoint(dir.path(), sample(0, 1, step));
  spit(dir.path() + "/shard-0-of-1/ckpt-9999999999999999999.psckpt", "past int64");
  spit(dir.path() + "/shard-0-of-1/ckpt-4611686018427387905.psckpt", "past kMaxStep");
  std::vector<int64_t> steps;
  for (const auto& f : list_checkpoints(dir.path(), 0, 1)) steps.push_back(f.step);
  CHECK(steps == std::vector<int64_t>{ps::kMaxStep, 999999999999999999, 7});
  CHECK(read_checkpoint(list_checkpoints(dir.path(), 0, 1)[0].path).global_step == ps::kMaxStep);
}

TEST_CASE(
    "load_checkpoint reassembles split tensors from every shard, newest complete valid step") {
  TempDir dir;
  // "e" (10 elements) split in parts over 2 shards; "s" whole on shard 1.
  auto shard_file = [&](uint32_t shard, int64_t step, float base) {
    ShardCheckpoint c;
    c.shard_index = shard;
    c.num_shards = 2;
    c.global_step = step;
    TensorCheckpoint part;
    part.spec = {.name = "e/part_" + std::to_string(shard),
                 .shape = {5},
                 .optimizer = OptimizerConfig::adam(0.1f)};
    part.part = PartMeta{"e", {2, 5}, shard * 5u, shard, 2};
    part.version = 4 + shard;
    for (int i = 0; i < 5; ++i) part.values.push_back(base + shard * 5 + i);
    part.slots = {part.values, part.values};
    for (auto& v : part.slots[1]) v *= 2;
    c.tensors.push_back(part);
    if (shard == 1) {
      TensorCheckpoint s;
      s.spec = {.name = "s", .shape = {1}};
      s.values = {base};
      c.tensors.push_back(s);
    }
    return write_checkpoint(dir.path(), c);
  };
  shard_file(0, 10, 0);
  shard_file(1, 10, 0);
  shard_file(0, 20, 100);
  const std::string newest_1 = shard_file(1, 20, 100);
  shard_file(0, 30, 200);  // shard 1 never wrote step 30: incomplete

  RestoredModel m = load_checkpoint(dir.path());
  CHECK(m.global_step == 20);
  CHECK(m.num_shards == 2);
  REQUIRE(m.tensors.size() == 2);
  const TensorSpec& e = m.tensors[0];
  CHECK(e.name == "e");
  CHECK(e.shape == std::vector<uint64_t>{2, 5});
  CHECK(e.version == 5);
  for (int i = 0; i < 10; ++i) {
    CHECK(e.init.values[i] == 100.0f + i);
    CHECK(e.slots[1][i] == 2 * (100.0f + i));
  }
  CHECK(m.tensors[1].name == "s");

  // Damage step 20 on shard 1: step 10 is used instead.
  std::string bytes = slurp(newest_1);
  bytes[bytes.size() / 2] ^= 1;
  spit(newest_1, bytes);
  m = load_checkpoint(dir.path());
  CHECK(m.global_step == 10);
  CHECK(m.tensors[0].init.values[9] == 9.0f);

  TempDir empty;
  CHECK_THROWS_AS(load_checkpoint(empty.path()), CheckpointError);
}

TEST_CASE(
    "pruning after a write keeps the file just written, and leaves files of later steps alone") {
  TempDir dir;
  // Steps 4-6 from an earlier run (psd restored step 3: say it could not
  // read them); this run writes 4 again, then 5.
  for (int64_t step : {1, 2, 3, 4, 5, 6}) write_checkpoint(dir.path(), sample(0, 1, step));
  write_checkpoint(dir.path(), sample(0, 1, 4));
  prune_checkpoints(dir.path(), 0, 1, 1, /*written=*/4);
  std::vector<int64_t> steps;
  for (const auto& f : list_checkpoints(dir.path(), 0, 1)) steps.push_back(f.step);
  CHECK(steps ==
        std::vector<int64_t>{6, 5, 4});  // 4 kept (before: only 5 and 6), older ones pruned
}

TEST_CASE("record lengths and part offsets from the file are checked without overflow") {
  TempDir dir;
  SECTION("a record length of nearly 2^64 (its checksum right)") {
    const std::string path = write_checkpoint(dir.path(), sample(0, 1, 2));
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    in.close();
    std::size_t at = 16;  // after the header: skip two records, patch the third's length
    for (int r = 0; r < 2; ++r) {
      uint64_t len = 0;
      std::memcpy(&len, &bytes[at], 8);
      at += 8 + 4 + len + 4;
    }
    const uint64_t huge = ~uint64_t{0} - 3;  // + its 4-byte checksum wraps to 0
    const uint32_t crc = mask_crc(crc32c(&huge, 8));
    std::memcpy(&bytes[at], &huge, 8);
    std::memcpy(&bytes[at + 8], &crc, 4);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    CHECK_THROWS_AS(read_checkpoint(path),
                    CheckpointError);  // before: std::length_error, psd aborted
  }
  SECTION("a part offset that wraps past the end of the tensor") {
    ShardCheckpoint c = sample(0, 1, 5);
    TensorCheckpoint t;
    t.spec = {.name = "w/part_0", .shape = {5}};
    t.values.assign(5, 7.0f);
    t.part = PartMeta{"w", {8}, ~uint64_t{0}, 0, 1};  // offset + 5 wraps to 4
    c.tensors = {t};
    write_checkpoint(dir.path(), c);
    CHECK_THROWS_WITH(load_checkpoint(dir.path()),
                      Catch::Contains("does not fit"));  // before: a write before the buffer
  }
}
