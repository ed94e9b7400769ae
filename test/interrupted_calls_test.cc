// Blocking pulls and pushes against a psd that stopped answering (SIGSTOP):
// ClientOptions::interrupted gives them up on the calling thread, as
// call_timeout would (nothing more written into a pull's buffer, nothing
// more read from a push's), the Client works again once psd does, and a
// call that waits 5 s says so in the log, naming the shards it waits for.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ps/client.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Stops a psd (SIGSTOP) until resume() or the end of the scope, a failed
// check included.
struct StoppedPsd {
  explicit StoppedPsd(pid_t p) : pid(p) { ::kill(pid, SIGSTOP); }
  ~StoppedPsd() { resume(); }
  void resume() {
    if (stopped) ::kill(pid, SIGCONT);
    stopped = false;
  }
  StoppedPsd(const StoppedPsd&) = delete;
  StoppedPsd& operator=(const StoppedPsd&) = delete;
  pid_t pid;
  bool stopped = true;
};

// An `interrupted` that turns true `after` its arm(), and records whether
// every ask came from the thread that armed it.
struct Interrupter {
  void arm(std::chrono::milliseconds after) {
    deadline = Clock::now() + after;
    caller = std::this_thread::get_id();
    asks = 0;
    other_thread = false;
  }
  std::function<bool()> callback() {
    return [this] {
      ++asks;
      if (std::this_thread::get_id() != caller) other_thread = true;
      return Clock::now() >= deadline;
    };
  }
  Clock::time_point deadline = Clock::time_point::max();
  std::thread::id caller;
  std::atomic<int> asks{0};
  std::atomic<bool> other_thread{false};
};

// The default logger's lines, kept for the test (and still printed).
class KeptLines : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.begin(), msg.payload.end());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

struct CapturedLog {
  CapturedLog() : sink(std::make_shared<KeptLines>()), previous(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>(
        "captured",
        spdlog::sinks_init_list{sink, std::make_shared<spdlog::sinks::stderr_color_sink_mt>()});
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous); }
  std::shared_ptr<KeptLines> sink;
  std::shared_ptr<spdlog::logger> previous;
};

// `call()` given up by `stop`, armed for 300 ms: InterruptedError within
// 0.25-1.5 s (not at call_timeout), every ask made on this thread.
template <class F>
void check_given_up_soon(Interrupter& stop, F call) {
  stop.arm(300ms);
  const auto start = Clock::now();
  CHECK_THROWS_AS(call(), InterruptedError);
  const auto took = Clock::now() - start;
  CHECK(took >= 250ms);
  CHECK(took < 1500ms);
  CHECK(stop.asks >= 2);
  CHECK_FALSE(stop.other_thread);
}

ClientOptions options_for(const std::vector<std::string>& hosts, Interrupter* stop) {
  ClientOptions o;
  o.ps_hosts = hosts;
  o.connect_timeout = 1s;
  o.call_timeout = 8s;
  o.reconnect_timeout = 5s;
  if (stop) o.interrupted = stop->callback();
  return o;
}

constexpr std::size_t kFloats = 16u
                                << 20;  // 64 MiB: more than the sockets hold while psd is stopped

}  // namespace

TEST_CASE(
    "a blocking pull given up by ClientOptions::interrupted writes nothing more into the "
    "caller's buffer, and the next pull works") {
  PsdProcess psd;
  Interrupter stop;
  // Over TCP, values landing straight in the caller's buffer; and through
  // shared memory (a Unix socket), copied from there once the reply is in.
  for (const bool shared : {false, true}) {
    INFO((shared ? "shared memory" : "TCP"));
    ClientOptions o = options_for({psd.address()}, &stop);
    o.prefer_unix_socket = shared;
    if (!shared) o.shared_memory_bytes = 0;
    Client client(o);
    const std::string name = shared ? "w_shared" : "w_tcp";
    client.create({{.name = name, .shape = {kFloats}, .optimizer = OptimizerConfig::sgd(1.0f)}});
    const std::vector<float> g(kFloats, 0.5f);
    client.push(name, g);  // w = -0.5

    std::vector<float> out(kFloats, 7.0f);
    {
      StoppedPsd stopped(psd.pid());
      check_given_up_soon(stop, [&] { client.pull(name, out); });
      CHECK_THROWS_WITH(client.pull(name, out),
                        Catch::Contains("pull: ") && Catch::Contains("interrupted"));
      // psd answers both pulls now: nothing of it may reach `out`.
      stopped.resume();
      std::this_thread::sleep_for(700ms);
    }
    CHECK(std::count(out.begin(), out.end(), 7.0f) == static_cast<std::ptrdiff_t>(kFloats));

    stop.arm(60s);
    client.pull(name, out);
    CHECK(std::count(out.begin(), out.end(), -0.5f) == static_cast<std::ptrdiff_t>(kFloats));
  }
}

TEST_CASE(
    "a blocking push given up by ClientOptions::interrupted sends nothing more from the "
    "caller's buffer, and the next call reconnects") {
  PsdProcess psd;
  Interrupter stop;
  ClientOptions o = options_for({psd.address()}, &stop);
  o.prefer_unix_socket = false;  // the gradient goes out from the caller's buffer
  o.shared_memory_bytes = 0;
  Client client(o);
  client.create({{.name = "w", .shape = {kFloats}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  std::vector<float> g(kFloats, 1.0f);
  {
    StoppedPsd stopped(psd.pid());
    check_given_up_soon(stop, [&] { client.push("w", g); });
    // The call is over: its caller reuses the buffer. None of this may
    // reach psd.
    std::fill(g.begin(), g.end(), 1000.0f);
    stopped.resume();
    std::this_thread::sleep_for(300ms);
  }
  stop.arm(60s);
  std::vector<float> before(kFloats), after(kFloats);
  client.pull("w", before);  // reconnects: the push's connection was cut
  CHECK(std::count(before.begin(), before.end(), -1000.0f) == 0);
  const std::vector<float> half(kFloats, 0.5f);
  client.push("w", half);
  client.pull("w", after);
  CHECK(after[0] == before[0] - 0.5f);
  CHECK(after[kFloats - 1] == before[kFloats - 1] - 0.5f);
}

TEST_CASE("a blocking pull with no answer for 5 s says whom it waits for, once every 10 s") {
  // Two shards, one tensor on each (round robin); only shard 1 is stopped.
  PsdProcess psd0, psd1;
  Interrupter stop;
  CapturedLog log;
  Client client(options_for({psd0.address(), psd1.address()}, &stop));
  client.create({{.name = "a", .shape = {4}}, {.name = "b", .shape = {4}}});
  std::vector<float> a(4), b(4);
  StoppedPsd stopped(psd1.pid());
  stop.arm(6500ms);
  const auto start = Clock::now();
  CHECK_THROWS_AS(client.pull({"a", "b"}, {std::span<float>(a), std::span<float>(b)}),
                  InterruptedError);
  CHECK(Clock::now() - start < 7500ms);
  std::vector<std::string> waits;
  for (const auto& line : log.sink->lines())
    if (line.find("pull: waiting") != std::string::npos) waits.push_back(line);
  REQUIRE(waits.size() == 1);
  CHECK(waits[0] ==
        "pull: waiting 5 s of 8 s (ClientOptions::call_timeout) for psd's answer "
        "from shard 1 (" +
            psd1.address() + ")");
}

TEST_CASE("a large blocking pull_rows, sent in parts, with no answer for 5 s says so") {
  // Small requests, so that 20,000 ids go out in several parts of two
  // requests each (Client::pull_rows outside sync mode).
  PsdProcess psd;
  Interrupter stop;
  CapturedLog log;
  ClientOptions o = options_for({psd.address()}, &stop);
  o.max_request_bytes = 64u << 10;
  Client client(o);
  client.create_tables({{.name = "emb", .dim = 4, .rows = 100000}});
  std::vector<int64_t> ids(20000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5);
  std::vector<float> rows(ids.size() * 4, 7.0f);
  StoppedPsd stopped(psd.pid());
  stop.arm(6500ms);
  CHECK_THROWS_AS(client.pull_rows("emb", ids, rows), InterruptedError);
  std::vector<std::string> waits;
  for (const auto& line : log.sink->lines())
    if (line.find("pull_rows: waiting") != std::string::npos) waits.push_back(line);
  REQUIRE(waits.size() == 1);
  CHECK_THAT(waits[0],
             Catch::Matches("pull_rows: waiting 5 s of 8 s \\(ClientOptions::call_timeout\\) for "
                            "psd's answers to ([0-9]+) of \\1 parts of 20000 ids"));
  stopped.resume();
  std::this_thread::sleep_for(300ms);
  CHECK(std::count(rows.begin(), rows.end(), 7.0f) == static_cast<std::ptrdiff_t>(rows.size()));
}

TEST_CASE(
    "a blocking pull handed to the loop's thread (an async pull in flight) is given up by "
    "ClientOptions::interrupted too, writing nothing more") {
  PsdProcess psd;
  Interrupter stop;
  ClientOptions o = options_for({psd.address()}, &stop);
  o.prefer_unix_socket = false;
  o.shared_memory_bytes = 0;
  Client client(o);
  client.create({{.name = "w", .shape = {kFloats}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  client.push("w", std::vector<float>(kFloats, 0.5f));  // w = -0.5
  std::vector<float> first(kFloats, 7.0f), out(kFloats, 7.0f);
  {
    StoppedPsd stopped(psd.pid());
    // While this pull waits, the client's helper thread runs its loop, and
    // the blocking pull below is handed to that thread.
    auto pending = client.pull_async({"w"}, {std::span<float>(first)});
    check_given_up_soon(stop, [&] { client.pull("w", out); });
    stopped.resume();
    pending.get();  // the async pull was not given up
    std::this_thread::sleep_for(500ms);
  }
  CHECK(std::count(out.begin(), out.end(), 7.0f) == static_cast<std::ptrdiff_t>(kFloats));
  CHECK(std::count(first.begin(), first.end(), -0.5f) == static_cast<std::ptrdiff_t>(kFloats));
}
