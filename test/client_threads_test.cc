// One ps::Client used from several threads at once (include/ps/client.h's
// thread-safety contract), against real psd processes: blocking and async
// calls mixed, to the same and different tensors and table rows; calls in
// flight while the Client is destroyed, while psd stops answering, and
// while psd restarts; a TrainingSession with async pulls beside it.
// Every case is bounded: a watchdog aborts the program (a failure) if a
// case deadlocks. Values are checked exactly. Run under ThreadSanitizer too
// (meson setup build-tsan -Db_sanitize=thread -Db_lundef=false).
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ps/client.h"
#include "ps/training_session.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;
using ps::test::TempDir;
using namespace std::chrono_literals;

namespace {

// Aborts the test program if not dismissed within `bound`: a deadlock fails
// the case in bounded time instead of hanging the suite.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds bound, std::string what)
      : what_(std::move(what)), thread_([this, bound] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, bound, [this] { return done_; })) {
            std::fprintf(stderr, "DEADLOCK? '%s' did not finish within %lld s\n", what_.c_str(),
                         static_cast<long long>(bound.count()));
            std::fflush(stderr);
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// What became of one future: a value, a ps::Error (its message), or
// anything else (a failure: std::future_error's "broken promise" included).
enum class Outcome { kValue, kPsError, kOther, kTimedOut };

template <typename T>
Outcome settle(std::future<T>& f, std::chrono::steady_clock::time_point deadline,
               std::string* message = nullptr) {
  if (f.wait_until(deadline) != std::future_status::ready) return Outcome::kTimedOut;
  try {
    f.get();
    return Outcome::kValue;
  } catch (const Error& e) {
    if (message) *message = e.what();
    return Outcome::kPsError;
  } catch (const std::exception& e) {
    if (message) *message = e.what();
    return Outcome::kOther;
  }
}

TensorSpec sgd(std::string name, uint64_t n) {
  return {.name = std::move(name), .shape = {n}, .optimizer = OptimizerConfig::sgd(1.0f)};
}

// Errors from worker threads, for the test's thread to report (Catch's
// assertions are not for other threads).
struct Errors {
  std::mutex mutex;
  std::vector<std::string> list;
  void add(std::string e) {
    std::lock_guard lock(mutex);
    list.push_back(std::move(e));
  }
  void require_none() {
    std::lock_guard lock(mutex);
    for (const auto& e : list) UNSCOPED_INFO(e);
    REQUIRE(list.empty());
  }
};

// One psd, reconnecting for up to 10 s (the restart cases).
ClientOptions reconnecting_options(const PsdProcess& psd) {
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.reconnect_timeout = 10s;
  return o;
}

}  // namespace

TEST_CASE(
    "one Client shared by threads: blocking and async pushes and pulls, tensors and rows, sum "
    "exactly") {
  const bool unix_socket = GENERATE(false, true);
  INFO((unix_socket ? "Unix socket and shared memory" : "TCP"));
  TempDir dir;
  std::vector<std::string> extra;
  if (unix_socket) extra = {"--unix_socket", dir.path() + "/psd.sock"};
  PsdProcess a(extra);
  if (unix_socket) extra = {"--unix_socket", dir.path() + "/psd2.sock"};
  PsdProcess b(extra);
  ClientOptions o;
  o.ps_hosts = {a.address(), b.address()};
  o.prefer_unix_socket = unix_socket;
  // "big" is cut into chunks over both shards, each sent in several parts
  // and requests; the small tensors are one part each.
  o.chunk_bytes = 64u << 10;
  o.part_bytes = 32u << 10;
  o.max_request_bytes = 64u << 10;
  Client client(o);

  constexpr int kThreads = 4, kIters = 24;
  // Every iteration but case 3's pushes "big", its own tensor and rows.
  constexpr int kPushIters = kIters - kIters / 4;
  constexpr uint64_t kBig = 40000, kSmall = 16, kRows = 64;
  constexpr uint32_t kDim = 8;
  std::vector<TensorSpec> specs = {sgd("big", kBig)};
  for (int t = 0; t < kThreads; ++t) specs.push_back(sgd("own" + std::to_string(t), kSmall));
  client.create(specs);
  client.create_tables(
      {{.name = "emb", .dim = kDim, .rows = kRows, .optimizer = RowOptimizerConfig::sgd(1.0f)}});

  Watchdog watchdog(90s, "shared Client, mixed calls");
  Errors errors;
  std::atomic<bool> stop_side{false};
  // A side thread: listing, stats, addresses, reports, placement, all the while.
  std::thread side([&] {
    try {
      while (!stop_side.load()) {
        if (client.list().size() != specs.size()) errors.add("list: wrong tensor count");
        if (client.stats().size() != 2) errors.add("stats: wrong shard count");
        if (client.connection_addresses().size() != 2) errors.add("addresses: wrong count");
        if (client.list_tables().size() != 1) errors.add("list_tables: wrong table count");
        (void)client.placement();
        (void)client.rollbacks();
        (void)client.job();
        std::this_thread::sleep_for(2ms);
      }
    } catch (const std::exception& e) {
      errors.add(std::string("side thread: ") + e.what());
    }
  });

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        const std::string own = "own" + std::to_string(t);
        const std::vector<float> g_big(kBig, float(t + 1)), g_own(kSmall, 1.0f);
        // Rows: ids t*8 .. t*8+7 are this thread's; id kRows-1 everyone's.
        std::vector<int64_t> ids;
        for (int k = 0; k < 8; ++k) ids.push_back(t * 8 + k);
        ids.push_back(kRows - 1);
        const std::vector<float> g_rows(ids.size() * kDim, 1.0f);
        std::vector<float> big_out(kBig), own_out(kSmall), rows_out(ids.size() * kDim);

        int own_issued = 0, own_done = 0;
        std::vector<std::future<PushResult>> own_inflight;  // completes in any order
        std::vector<std::future<PushResult>> big_inflight;
        std::vector<std::future<PushStatus>> row_inflight;
        auto finish_own = [&] {
          for (auto& f : own_inflight) {
            f.get();
            ++own_done;
          }
          own_inflight.clear();
        };
        for (int i = 0; i < kIters; ++i) {
          switch (i % 4) {
            case 0:
              client.push("big", g_big);
              client.push(own, g_own);
              ++own_issued, ++own_done;
              client.push_rows("emb", ids, g_rows);
              break;
            case 1:
              big_inflight.push_back(client.push_async({"big"}, {std::span<const float>(g_big)}));
              own_inflight.push_back(client.push_async({own}, {std::span<const float>(g_own)}));
              ++own_issued;
              row_inflight.push_back(client.push_rows_async("emb", ids, g_rows));
              break;
            case 2:
              // Two tensors in one call, one async.
              big_inflight.push_back(client.push_async(
                  {"big", own}, {std::span<const float>(g_big), std::span<const float>(g_own)}));
              ++own_issued;
              big_inflight.back().wait();  // own is in once this is ready
              ++own_done;
              row_inflight.push_back(client.push_rows_async("emb", ids, g_rows));
              break;
            case 3: {
              auto pulled = client.pull_async({"big"}, {std::span<float>(big_out)});
              auto rows = client.pull_rows_async("emb", ids, rows_out);
              client.pull(own, own_out);
              // Own pushes in flight may or may not be in; the done ones are.
              const float v = own_out[0];
              if (v > -float(own_done) || v < -float(own_issued))
                errors.add(own + ": pulled " + std::to_string(v) + " with " +
                           std::to_string(own_done) + ".." + std::to_string(own_issued) +
                           " pushes applied");
              pulled.get();
              rows.get();
              for (float x : big_out)
                if (x > 0 || x != float(int64_t(x))) {
                  errors.add("big: pulled a value " + std::to_string(x) + " no sum of pushes gives");
                  break;
                }
              break;
            }
          }
          if (own_inflight.size() >= 3) finish_own();
          // Pull with nothing of its own in flight: exactly its own pushes.
          if (i % 6 == 5) {
            finish_own();
            client.pull(own, own_out);
            if (own_out != std::vector<float>(kSmall, -float(own_done)))
              errors.add(own + ": pulled " + std::to_string(own_out[0]) + " after " +
                         std::to_string(own_done) + " pushes");
          }
        }
        finish_own();
        for (auto& f : big_inflight) f.get();
        for (auto& f : row_inflight) f.get();
        if (own_done != kPushIters) errors.add(own + ": " + std::to_string(own_done) + " pushes done");
      } catch (const std::exception& e) {
        errors.add("thread " + std::to_string(t) + ": " + e.what());
      }
    });
  }
  for (auto& th : threads) th.join();
  stop_side = true;
  side.join();
  errors.require_none();

  // big: every thread pushed t+1 in every iteration but case 3's.
  const int big_pushes = kPushIters;
  const float big_expected = -float(big_pushes * (1 + 2 + 3 + 4));
  const auto big = client.pull("big");
  CHECK(std::count(big.begin(), big.end(), big_expected) == int64_t(kBig));
  for (int t = 0; t < kThreads; ++t)
    CHECK(client.pull("own" + std::to_string(t)) == std::vector<float>(kSmall, -float(kPushIters)));
  // Rows: pushed in cases 0, 1, 2 by each thread.
  std::vector<int64_t> all(kRows);
  for (uint64_t k = 0; k < kRows; ++k) all[k] = int64_t(k);
  std::vector<float> rows(kRows * kDim);
  client.pull_rows("emb", all, rows);
  for (uint64_t k = 0; k < kRows; ++k) {
    float expected = 0;
    if (k < uint64_t(kThreads) * 8) expected = -float(big_pushes);
    if (k == kRows - 1) expected = -float(big_pushes * kThreads);
    INFO("row " << k);
    CHECK(rows[k * kDim] == expected);
    CHECK(rows[k * kDim + kDim - 1] == expected);
  }
}

TEST_CASE("a Client destroyed with async calls from several threads in flight settles every future") {
  const bool stopped = GENERATE(false, true);
  INFO((stopped ? "psd stopped (nothing answered)" : "psd answering"));
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.connect_timeout = 300ms;
  constexpr int kThreads = 4, kCalls = 40;
  std::vector<float> g(1024, 1.0f);
  std::vector<std::vector<float>> outs(kThreads * kCalls, std::vector<float>(1024));
  std::vector<std::future<PushResult>> pushes(kThreads * kCalls);
  std::vector<std::future<PullResult>> pulls(kThreads * kCalls);
  Watchdog watchdog(60s, "Client destroyed with calls in flight");
  {
    auto client = std::make_unique<Client>(o);
    client->create({sgd("w", 1024)});
    if (stopped) ::kill(psd.pid(), SIGSTOP);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kCalls; ++i) {
          const int k = t * kCalls + i;
          pushes[k] = client->push_async({"w"}, {std::span<const float>(g)});
          pulls[k] = client->pull_async({"w"}, {std::span<float>(outs[k])});
        }
      });
    }
    for (auto& th : threads) th.join();
    client.reset();  // with (most of) them in flight
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  int values = 0, ps_errors = 0;
  for (int k = 0; k < kThreads * kCalls; ++k) {
    for (int which = 0; which < 2; ++which) {
      std::string message;
      const Outcome r = which == 0 ? settle(pushes[k], deadline, &message)
                                   : settle(pulls[k], deadline, &message);
      INFO("call " << k << (which == 0 ? " push" : " pull") << ": " << message);
      REQUIRE(r != Outcome::kTimedOut);
      REQUIRE(r != Outcome::kOther);
      if (r == Outcome::kValue) ++values;
      if (r == Outcome::kPsError) {
        ++ps_errors;
        CHECK_THAT(message, Catch::Contains("destroyed with this call in flight"));
      }
    }
  }
  if (stopped) {
    CHECK(values == 0);
    ::kill(psd.pid(), SIGCONT);
  }
  CHECK(values + ps_errors == 2 * kThreads * kCalls);
}

TEST_CASE(
    "threads blocked in calls on a psd that stopped answering all time out, then all go on") {
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.prefer_unix_socket = false;  // gradients out from the callers' buffers
  o.connect_timeout = 300ms;
  o.call_timeout = 1000ms;
  o.reconnect_timeout = 5s;
  Client client(o);
  constexpr int kThreads = 4;
  constexpr uint64_t kN = 64u << 10;  // 256 KiB: more than the socket takes at once
  std::vector<TensorSpec> specs;
  for (int t = 0; t < kThreads; ++t) {
    specs.push_back(sgd("w" + std::to_string(t), kN));
    specs.push_back(sgd("after" + std::to_string(t), 16));
  }
  client.create(specs);
  Watchdog watchdog(60s, "calls on a stopped psd");
  Errors errors;
  std::atomic<int> entered{0};
  ::kill(psd.pid(), SIGSTOP);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string w = "w" + std::to_string(t);
      std::vector<float> g(kN, 1.0f), out(kN);
      ++entered;
      const auto start = std::chrono::steady_clock::now();
      auto async = client.push_async({w}, {std::span<const float>(g)});
      try {
        if (t % 2 == 0) {
          client.pull(w, out);
        } else {
          client.push(w, g);
        }
        errors.add(w + ": a call to a stopped psd succeeded");
      } catch (const ConnectionError& e) {
        if (std::string(e.what()).find("no answer from psd") == std::string::npos)
          errors.add(w + ": " + e.what());
      } catch (const std::exception& e) {
        errors.add(w + ": not a ConnectionError: " + e.what());
      }
      std::string message;
      const Outcome r = settle(async, std::chrono::steady_clock::now() + 10s, &message);
      if (r != Outcome::kPsError) errors.add(w + ": async push to a stopped psd: " + message);
      if (std::chrono::steady_clock::now() - start > 8s) errors.add(w + ": took over 8 s");
      // `g` goes away now: nothing more of it may be read (the connection is cut).
    });
  }
  for (auto& th : threads) th.join();
  ::kill(psd.pid(), SIGCONT);
  errors.require_none();
  // Every thread goes on with the same Client, on a new connection.
  for (int t = 0; t < kThreads; ++t) {
    threads[t] = std::thread([&, t] {
      try {
        const std::string after = "after" + std::to_string(t);
        const std::vector<float> g(16, 1.0f);
        for (int i = 0; i < 10; ++i) client.push_async({after}, {std::span<const float>(g)}).get();
        if (client.pull(after) != std::vector<float>(16, -10.0f))
          errors.add(after + ": not 10 pushes' worth");
      } catch (const std::exception& e) {
        errors.add(std::string("after resume: ") + e.what());
      }
    });
  }
  for (auto& th : threads) th.join();
  errors.require_none();
}

TEST_CASE(
    "psd restarted (SIGTERM) while threads sharing a Client have calls in flight: every push "
    "applied exactly once") {
  TempDir dir;
  const std::vector<std::string> args = {"--checkpoint_dir", dir.path()};
  auto psd = std::make_unique<PsdProcess>(args);
  const int port = psd->port();
  Client client(reconnecting_options(*psd));
  constexpr int kThreads = 4, kPushes = 120;
  std::vector<TensorSpec> specs = {sgd("shared", 256)};
  for (int t = 0; t < kThreads; ++t) specs.push_back(sgd("own" + std::to_string(t), 16));
  client.create(specs);
  Watchdog watchdog(90s, "restart with calls in flight");
  Errors errors;
  std::atomic<int> pushed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        const std::string own = "own" + std::to_string(t);
        const std::vector<float> g_shared(256, 1.0f), g_own(16, 1.0f);
        std::vector<float> out(256);
        for (int i = 0; i < kPushes; i += 2) {
          auto f = client.push_async({"shared", own},
                                     {std::span<const float>(g_shared), std::span<const float>(g_own)});
          client.push({"shared", own}, {g_shared, g_own});
          client.pull("shared", out);
          f.get();
          pushed += 2;
          std::this_thread::sleep_for(1ms);
        }
      } catch (const std::exception& e) {
        errors.add("thread " + std::to_string(t) + ": " + e.what());
      }
    });
  }
  const auto waited = std::chrono::steady_clock::now();
  while (pushed < kThreads * kPushes / 4 && std::chrono::steady_clock::now() - waited < 30s)
    std::this_thread::sleep_for(1ms);
  CHECK(psd->stop() == 0);  // checkpoint on the way out
  psd = std::make_unique<PsdProcess>(args, port);
  for (auto& th : threads) th.join();
  errors.require_none();
  CHECK(client.rollbacks() >= 1);
  CHECK(client.pull("shared") == std::vector<float>(256, -float(kThreads * kPushes)));
  for (int t = 0; t < kThreads; ++t)
    CHECK(client.pull("own" + std::to_string(t)) == std::vector<float>(16, -float(kPushes)));
}

TEST_CASE(
    "psd killed (SIGKILL) and restarted while threads have calls in flight: every call settles, "
    "and the Client goes on") {
  TempDir dir;
  const std::vector<std::string> args = {"--checkpoint_dir", dir.path(), "--checkpoint_secs",
                                         "0.05"};
  auto psd = std::make_unique<PsdProcess>(args);
  const int port = psd->port();
  Client client(reconnecting_options(*psd));
  client.create({sgd("w", 4096)});
  client.checkpoint();  // the model is on disk before the kill
  Watchdog watchdog(90s, "SIGKILL with calls in flight");
  constexpr int kThreads = 4;
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::mutex mutex;
  std::vector<std::string> bad;  // outcomes that are not a value or a ps::Error
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<float> g(4096, 1.0f);
      std::vector<float> out(4096);
      while (!stop.load()) {
        auto push = client.push_async({"w"}, {std::span<const float>(g)});
        auto pull = client.pull_async({"w"}, {std::span<float>(out)});
        std::string message;
        const auto deadline = std::chrono::steady_clock::now() + 30s;
        for (Outcome r : {settle(push, deadline, &message), settle(pull, deadline, &message)}) {
          if (r == Outcome::kTimedOut || r == Outcome::kOther) {
            std::lock_guard lock(mutex);
            bad.push_back("thread " + std::to_string(t) + ": " + message);
          }
        }
        try {
          client.push("w", g);
        } catch (const Error&) {
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex);
          bad.push_back(e.what());
        }
        ++calls;
      }
    });
  }
  while (calls < 40) std::this_thread::sleep_for(1ms);
  psd->kill();
  psd = std::make_unique<PsdProcess>(args, port);
  const int at_restart = calls.load();
  const auto waited = std::chrono::steady_clock::now();
  while (calls < at_restart + 40 && std::chrono::steady_clock::now() - waited < 30s)
    std::this_thread::sleep_for(1ms);
  stop = true;
  for (auto& th : threads) th.join();
  for (const auto& b : bad) UNSCOPED_INFO(b);
  CHECK(bad.empty());
  CHECK(calls >= at_restart + 40);
  // The Client works on: a push now is applied once more.
  const float before = client.pull("w")[0];
  client.push("w", std::vector<float>(4096, 1.0f));
  CHECK(client.pull("w")[0] == before - 1.0f);
}

TEST_CASE("a TrainingSession's steps with another thread pulling the same variables async") {
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.worker_index = 0;
  o.is_chief = true;
  Client client(o);
  constexpr int kSteps = 60;
  constexpr uint64_t kN = 8192;
  std::vector<float> w(kN), grad(kN, 1.0f);
  TrainingSession session(client, {.job = {.mode = SyncMode::kAsync, .train_steps = kSteps}});
  session.add_variable(sgd("w", kN), w, grad);
  session.initialize();
  Watchdog watchdog(60s, "TrainingSession beside async pulls");
  std::atomic<bool> stop{false};
  Errors errors;
  std::thread reader([&] {
    try {
      std::vector<float> a(kN), b(kN);
      while (!stop.load()) {
        auto fa = client.pull_async({"w"}, {std::span<float>(a)});
        auto fb = client.pull_async({"w"}, {std::span<float>(b)});
        const auto ra = fa.get();
        fb.get();
        if (ra.versions.at(0) > uint64_t(kSteps)) errors.add("more versions than steps");
        for (float x : a)
          if (x != -float(ra.versions[0])) {
            errors.add("a pull saw " + std::to_string(x) + " at version " +
                       std::to_string(ra.versions[0]));
            break;
          }
        (void)client.stats();
      }
    } catch (const std::exception& e) {
      errors.add(std::string("reader: ") + e.what());
    }
  });
  int steps = 0;
  while (!session.should_stop() && steps < 2 * kSteps) {
    session.run_step([] {});
    ++steps;
  }
  stop = true;
  reader.join();
  errors.require_none();
  CHECK(session.should_stop());
  CHECK(steps == kSteps);
  CHECK(client.pull("w") == std::vector<float>(kN, -float(kSteps)));
}
