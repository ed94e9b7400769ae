// SummaryWriter: crc32c vectors, and a decode of our own event file (framing,
// both crcs, protobuf fields).
#include "ps/summary_writer.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "test/idx_fixture.h"
#include "ps/errors.h"
#include "ps/hooks.h"

TEST_CASE("crc32c known vectors and masking") {
  CHECK(ps::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(ps::crc32c("", 0) == 0u);
  // RFC 3720 (iSCSI) B.4 test vectors.
  unsigned char buf[32];
  std::memset(buf, 0, 32);
  CHECK(ps::crc32c(buf, 32) == 0x8A9136AAu);
  std::memset(buf, 0xff, 32);
  CHECK(ps::crc32c(buf, 32) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  CHECK(ps::crc32c(buf, 32) == 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  CHECK(ps::crc32c(buf, 32) == 0x113FDB5Cu);
  // Extending a crc equals one pass.
  CHECK(ps::crc32c("6789", 4, ps::crc32c("12345", 5)) == 0xE3069283u);
  CHECK(ps::mask_crc(0xE3069283u) == (((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u));
  CHECK(ps::unmask_crc(ps::mask_crc(0xE3069283u)) == 0xE3069283u);
}

namespace {

// A decoded protobuf message: field number -> raw values (varints and
// fixed values as uint64, length-delimited as bytes).
struct Msg {
  std::multimap<int, uint64_t> nums;
  std::multimap<int, std::string> bytes;
  std::map<int, int> wire;
};

uint64_t varint(const std::string& s, size_t& p) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(p < s.size());
    REQUIRE(shift < 64);
    const uint8_t b = static_cast<uint8_t>(s[p++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

uint64_t le(const std::string& s, size_t p, int n) {
  REQUIRE(p + n <= s.size());
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(static_cast<uint8_t>(s[p + i])) << (8 * i);
  return v;
}

Msg decode(const std::string& s) {
  Msg m;
  size_t p = 0;
  while (p < s.size()) {
    const uint64_t key = varint(s, p);
    const int field = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
    m.wire[field] = type;
    if (type == 0) {
      m.nums.emplace(field, varint(s, p));
    } else if (type == 1) {
      m.nums.emplace(field, le(s, p, 8));
      p += 8;
    } else if (type == 5) {
      m.nums.emplace(field, le(s, p, 4));
      p += 4;
    } else {
      REQUIRE(type == 2);
      const uint64_t n = varint(s, p);
      REQUIRE(p + n <= s.size());
      m.bytes.emplace(field, s.substr(p, n));
      p += n;
    }
  }
  return m;
}

double as_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
float as_float(uint64_t bits) {
  uint32_t b = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Splits a TFRecord file into records, checking both crcs of each.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string f = ss.str();
  std::vector<std::string> out;
  size_t p = 0;
  while (p < f.size()) {
    REQUIRE(p + 12 <= f.size());
    const uint64_t len = le(f, p, 8);
    CHECK(ps::unmask_crc(static_cast<uint32_t>(le(f, p + 8, 4))) == ps::crc32c(f.data() + p, 8));
    REQUIRE(p + 12 + len + 4 <= f.size());
    std::string data = f.substr(p + 12, len);
    CHECK(ps::unmask_crc(static_cast<uint32_t>(le(f, p + 12 + len, 4))) ==
          ps::crc32c(data.data(), data.size()));
    out.push_back(std::move(data));
    p += 12 + len + 4;
  }
  return out;
}

// A file's scalars, in the order written: what a hook test reads back.
struct Scalar {
  std::string tag;
  int64_t step;
  float value;
};
std::vector<Scalar> read_scalars(const std::string& path) {
  std::vector<Scalar> out;
  auto recs = read_records(path);
  for (std::size_t i = 1; i < recs.size(); ++i) {
    Msg ev = decode(recs[i]);
    if (ev.bytes.count(5) == 0) continue;
    Msg value = decode(decode(ev.bytes.find(5)->second).bytes.find(1)->second);
    out.push_back({value.bytes.find(1)->second, static_cast<int64_t>(ev.nums.find(2)->second),
                   as_float(value.nums.find(2)->second)});
  }
  return out;
}

}  // namespace

TEST_CASE("event file: name, framing, crcs, fields") {
  ps_test::TempDir t;
  const std::string logdir = t / "run1/train";  // nested: created on demand
  std::string path;
  const double start = static_cast<double>(std::time(nullptr));
  {
    ps::SummaryWriter w(logdir);
    path = w.path();
    w.add_scalar("loss", 2.5f, 0);
    w.add_scalar("accuracy/validation", 0.875f, 100);
    w.add_scalar("loss", -1e-3f, -1);  // a negative step still round-trips
    w.flush();
    w.add_scalar("loss", 0.25f, int64_t(1) << 40);
  }  // destructor flushes the last one
  const std::string name = std::filesystem::path(path).filename();
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(std::filesystem::path(path).parent_path() == logdir);

  auto recs = read_records(path);
  REQUIRE(recs.size() == 5);
  Msg first = decode(recs[0]);
  CHECK(first.bytes.find(3)->second == "brain.Event:2");
  CHECK(first.wire[1] == 1);
  const double wall = as_double(first.nums.find(1)->second);
  CHECK(wall >= start - 1);
  CHECK(wall <= start + 60);
  // (Not "." + to_string(...): GCC 12 warns -Wrestrict on it, wrongly.)
  std::string stamp = std::to_string(static_cast<long long>(wall));
  stamp.insert(stamp.begin(), '.');
  stamp.push_back('.');
  CHECK(name.find(stamp) != std::string::npos);

  struct Want {
    const char* tag;
    float value;
    int64_t step;
  } want[] = {{"loss", 2.5f, 0},
              {"accuracy/validation", 0.875f, 100},
              {"loss", -1e-3f, -1},
              {"loss", 0.25f, int64_t(1) << 40}};
  for (int i = 0; i < 4; ++i) {
    INFO("record " << i + 1);
    Msg ev = decode(recs[i + 1]);
    CHECK(ev.wire[1] == 1);  // double
    CHECK(as_double(ev.nums.find(1)->second) >= wall);
    if (want[i].step == 0) {
      CHECK(ev.nums.count(2) == 1);  // written even when 0
    }
    CHECK(static_cast<int64_t>(ev.nums.find(2)->second) == want[i].step);
    REQUIRE(ev.bytes.count(5) == 1);
    Msg summary = decode(ev.bytes.find(5)->second);
    REQUIRE(summary.bytes.count(1) == 1);
    Msg value = decode(summary.bytes.find(1)->second);
    CHECK(value.bytes.find(1)->second == want[i].tag);
    CHECK(value.wire[2] == 5);  // float
    CHECK(as_float(value.nums.find(2)->second) == want[i].value);
  }
}

TEST_CASE("two writers in one second get two files; bad logdir") {
  ps_test::TempDir t;
  ps::SummaryWriter a(t.path), b(t.path);
  CHECK(a.path() != b.path());
  CHECK_THROWS_AS(ps::SummaryWriter("/proc/version/x"), ps::ConfigError);
  CHECK_THROWS_WITH(ps::SummaryWriter("/proc/version/x"), Catch::Contains("cannot create"));
}

TEST_CASE("SummaryHook averages accuracy over the steps that measured it") {
  ps_test::TempDir t;
  std::string path;
  {
    ps::SummaryWriter w(t / "run");
    path = w.path();
    ps::SummaryHook hook(w, 2);
    hook.begin();
    hook.after_step(
        {.local_step = 1, .global_step = 1, .loss = 1.0, .accuracy = -1});  // measured none
    hook.after_step({.local_step = 2, .global_step = 2, .loss = 3.0, .accuracy = 0.8});
  }
  std::map<std::string, float> written;
  for (const Scalar& s : read_scalars(path)) written[s.tag] = s.value;
  CHECK(written.at("loss") == 2.0f);
  CHECK(written.at("accuracy/train") == Approx(0.8f));  // before: (0.8 - 1) / 2
}

TEST_CASE(
    "SummaryHook's rates count from the step a worker joined at, and skip a step that went back") {
  ps_test::TempDir t;
  std::string path;
  {
    ps::SummaryWriter w(t / "run");
    path = w.path();
    ps::SummaryHook hook(w, 2);
    hook.begin();
    // A chief restarted into a job at step 994.
    hook.after_step(
        {.local_step = 1, .global_step = 995, .loss = 1.0, .examples_per_global_step = 10});
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    hook.after_step(
        {.local_step = 2, .global_step = 996, .loss = 1.0, .examples_per_global_step = 10});
    // The ps restored an older checkpoint: the step goes back.
    hook.after_step(
        {.local_step = 3, .global_step = 500, .loss = 1.0, .examples_per_global_step = 10});
    hook.after_step(
        {.local_step = 4, .global_step = 501, .loss = 1.0, .examples_per_global_step = 10});
  }
  std::vector<std::pair<int64_t, float>> rates;
  for (const Scalar& s : read_scalars(path)) {
    if (s.tag == "global_step/sec") rates.emplace_back(s.step, s.value);
  }
  REQUIRE(rates.size() == 1);  // none at step 501: the step went back, and a rate is never negative
  CHECK(rates[0].first == 996);
  // 2 steps in >= 50 ms: at most 40/s (a rate counted from step 0 would
  // take in all 996 steps).
  CHECK(rates[0].second > 0);
  CHECK(rates[0].second <= 40);
}

TEST_CASE("a tag that is not UTF-8 is written as valid UTF-8") {
  // A protobuf string field with bad UTF-8 makes TensorBoard's reader stop at
  // that record.
  ps_test::TempDir t;
  std::string path;
  {
    ps::SummaryWriter w(t / "run");
    path = w.path();
    w.add_scalar("caf\xe9/loss", 1.0f, 1);        // Latin-1
    w.add_scalar("d\xc3\xa9j\xc3\xa0", 2.0f, 2);  // valid: kept
    w.add_scalar("cut\xe2\x82", 3.0f, 3);         // a sequence cut short
    w.add_scalar("\xed\xa0\x80x", 4.0f, 4);       // a surrogate
  }
  auto scalars = read_scalars(path);
  REQUIRE(scalars.size() == 4);
  CHECK(scalars[0].tag == "caf\xef\xbf\xbd/loss");
  CHECK(scalars[1].tag == "d\xc3\xa9j\xc3\xa0");
  CHECK(scalars[2].tag == "cut\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(scalars[3].tag == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx");
}

namespace {
struct CountingHook : ps::TrainingHook {
  std::vector<int64_t>& seen;
  explicit CountingHook(std::vector<int64_t>& s) : seen(s) {}
  void after_step(const ps::StepInfo& s) override { seen.push_back(s.local_step); }
};
}  // namespace

TEST_CASE("HookList: a call that repeats the last local step reaches no hook") {
  // run_step() that found the job already done runs no step; a loop calling
  // after_step() after it anyway must not fire the hooks again.
  ps_test::TempDir t;
  std::string path;
  std::vector<int64_t> seen;
  int fired = 0;
  {
    ps::SummaryWriter w(t / "run");
    path = w.path();
    ps::HookList hooks;
    hooks.add<CountingHook>(seen);
    hooks.add<ps::SummaryHook>(w, 2);
    hooks.add<ps::EveryNStepsHook>(2, [&](const ps::StepInfo&) { ++fired; });
    hooks.begin();
    hooks.after_step({.local_step = 1, .global_step = 1, .loss = 1.0});
    hooks.after_step({.local_step = 2, .global_step = 2, .loss = 1.0});
    hooks.after_step({.local_step = 2, .global_step = 3, .loss = 0.0});  // no step ran
    hooks.end({.local_step = 2, .global_step = 3});
  }
  CHECK(seen == std::vector<int64_t>{1, 2});
  CHECK(fired == 1);
  int losses = 0;
  for (const Scalar& s : read_scalars(path)) {
    if (s.tag == "loss") {
      ++losses;
      CHECK(s.value == 1.0f);
    }
  }
  CHECK(losses == 1);
}
