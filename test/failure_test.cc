// Worker failures in sync mode against a real psd: a worker process killed
// with SIGKILL (the job goes on with the others; a restarted worker rejoins)
// and a worker that hangs with its connection open (--worker_timeout_secs).
// One test program per area: its cases share the helpers at its top;
// splitting it would duplicate them.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "ps/client.h"
#include "ps/embedding.h"
#include "ps/training_session.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;
using ps::test::TempDir;
using namespace std::chrono_literals;

namespace {

// Stops a psd (SIGSTOP) for the scope: it keeps its connections and
// answers nothing. SIGCONT when the scope ends, a failed check included.
struct StoppedPsd {
  explicit StoppedPsd(pid_t p) : pid(p) { ::kill(pid, SIGSTOP); }
  ~StoppedPsd() { ::kill(pid, SIGCONT); }
  StoppedPsd(const StoppedPsd&) = delete;
  StoppedPsd& operator=(const StoppedPsd&) = delete;
  pid_t pid;
};

// A client of `psd` over TCP (large gradients go out from the caller's
// buffer, not through shared memory) whose calls give up after 1.5 s.
ClientOptions gives_up_soon(const PsdProcess& psd) {
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.prefer_unix_socket = false;
  o.connect_timeout = 300ms;
  o.call_timeout = 1500ms;
  o.reconnect_timeout = 5s;
  return o;
}

}  // namespace

namespace {

// A sync_worker process, stopped by PID when the test is done with it.
class WorkerProcess {
 public:
  WorkerProcess(const PsdProcess& psd, int worker, const std::string& log, int steps) {
    std::vector<std::string> args = {ps::test::program_path("SYNC_WORKER_BIN"),
                                     "--ps_hosts",
                                     psd.address(),
                                     "--worker",
                                     std::to_string(worker),
                                     "--workers",
                                     "3",
                                     "--replicas",
                                     "3",
                                     "--steps",
                                     std::to_string(steps),
                                     "--sleep_ms",
                                     "10"};
    pid_ = ps::test::spawn_logged(args, log);
  }
  ~WorkerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  void kill() {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Exit status, or -1 if still running after `timeout`.
  int wait(std::chrono::milliseconds timeout) {
    for (auto waited = 0ms; waited < timeout; waited += 10ms) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

int64_t wait_for_step(Client& observer, int64_t step, std::chrono::milliseconds timeout) {
  int64_t now = 0;
  for (auto waited = 0ms; waited < timeout; waited += 10ms) {
    now = observer.stats()[0].global_step;
    if (now >= step) break;
    std::this_thread::sleep_for(10ms);
  }
  return now;
}

// Worker 1 as a child process running `call` with its own Client, forked
// before this process has a client (its threads would not be in the
// child); the test kills it by PID.
template <typename Call>
pid_t fork_worker(const ClientOptions& o, Call call) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      ClientOptions w = o;
      w.worker_index = 1;
      Client worker(w);
      call(worker);
    } catch (...) {
    }
    ::_exit(0);
  }
  return child;
}

}  // namespace

TEST_CASE("sync: a worker killed mid-training does not stop the job, and a restarted one rejoins") {
  PsdProcess psd;
  TempDir logs;
  const int steps = 70;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  Client observer(o);
  auto w0 = std::make_unique<WorkerProcess>(psd, 0, logs.path() + "/w0.log", steps);
  auto w1 = std::make_unique<WorkerProcess>(psd, 1, logs.path() + "/w1.log", steps);
  auto w2 = std::make_unique<WorkerProcess>(psd, 2, logs.path() + "/w2.log", steps);
  REQUIRE(wait_for_step(observer, 10, 10s) >= 10);
  w2->kill();
  const uint64_t pushes_before = observer.stats()[0].workers.at(2).pushes;
  const int64_t at_kill = observer.stats()[0].global_step;
  // Two workers carry on (each step now averages their two gradients).
  CHECK(wait_for_step(observer, at_kill + 15, 5s) >= at_kill + 15);
  w2 = std::make_unique<WorkerProcess>(psd, 2, logs.path() + "/w2b.log", steps);
  CHECK(w0->wait(20s) == 0);
  CHECK(w1->wait(5s) == 0);
  CHECK(w2->wait(5s) == 0);
  auto st = observer.stats()[0];
  CHECK(st.global_step == steps);
  CHECK(st.workers.at(2).pushes > pushes_before);  // the restarted worker contributed again
  CHECK_THAT(psd.log(),
             Catch::Contains("worker 2 (127.0.0.1:") && Catch::Contains(") disconnected"));
}

TEST_CASE(
    "sync: a hung worker (connection open, silent) is not waited for past --worker_timeout_secs") {
  PsdProcess psd({"--worker_timeout_secs", "1"});
  const JobConfig job{
      .mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2, .train_steps = 15};
  std::atomic<bool> release{false};
  std::atomic<int> failures{0};
  std::thread hung([&] {
    try {
      ClientOptions o;
      o.ps_hosts = {psd.address()};
      o.worker_index = 1;
      Client client(o);
      TrainingSession session(client, {.job = job});
      std::vector<float> v(8), g(8, 1.0f);
      session.add_variable({.name = "v", .shape = {8}}, v, g);
      session.initialize();
      session.run_step([] {});
      while (!release) std::this_thread::sleep_for(10ms);  // hangs, connection open
    } catch (const std::exception& e) {
      UNSCOPED_INFO("hung worker: " << e.what());
      ++failures;
    }
  });
  const auto start = std::chrono::steady_clock::now();
  {
    ClientOptions o;
    o.ps_hosts = {psd.address()};
    o.worker_index = 0;
    o.is_chief = true;
    Client client(o);
    TrainingSession session(client, {.job = job});
    std::vector<float> v(8), g(8, 1.0f);
    session.add_variable({.name = "v", .shape = {8}}, v, g);
    session.initialize();
    while (!session.should_stop()) session.run_step([] { std::this_thread::sleep_for(5ms); });
  }
  const auto took = std::chrono::steady_clock::now() - start;
  release = true;
  hung.join();
  CHECK(failures == 0);
  CHECK(took < 4s);  // about one timeout, not a hang
  CHECK_THAT(psd.log(), Catch::Contains("worker 1 silent"));
}

TEST_CASE(
    "sync: a worker that stalls half way through its push is not waited for past "
    "--worker_timeout_secs") {
  PsdProcess psd({"--worker_timeout_secs", "1"});
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.worker_index = 0;
  o.is_chief = true;
  Client chief(o);
  const TensorSpec a{.name = "a", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  const TensorSpec b{.name = "b", .shape = {2}, .optimizer = OptimizerConfig::sgd(1.0f)};
  chief.create({a, b});
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
  chief.set_ready();
  ClientOptions w = o;
  w.worker_index = 1;
  w.is_chief = false;
  Client stalled(w);
  stalled.declare({a, b});
  const std::vector<float> one(2, 1.0f), three(2, 3.0f);
  stalled.push("a", three);  // a only; then silent with its connection open
  const auto start = std::chrono::steady_clock::now();
  chief.push({"a", "b"}, {std::span<const float>(one), std::span<const float>(one)}, 0);
  // Before, having given a gradient counted as waiting for the step: the
  // step waited for b from worker 1 for good.
  CHECK(wait_for_step(chief, 1, 6s) == 1);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(chief.pull("a") == std::vector<float>(2, -2.0f));  // (1 + 3) / 2: worker 1's a still counts
  CHECK(chief.pull("b") == std::vector<float>(2, -1.0f));  // the chief's alone
  CHECK_THAT(psd.log(), Catch::Contains("worker 1 silent"));
}

TEST_CASE(
    "a worker killed while psd holds its call waiting is let go at once, not when the wait ends") {
  TempDir dir;
  PsdProcess psd({"--checkpoint_dir", dir.path()});
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  for (const char* call : {"barrier", "waitReady", "sync pull", "checkpoint at a later step"}) {
    INFO(call);
    const std::string what = call;
    // Killed once its call waits in psd.
    const pid_t child = fork_worker(o, [&](Client& worker) {
      if (what == "barrier") {
        worker.barrier("b", 2, 600s);
      } else if (what == "waitReady") {
        worker.wait_ready(600s);  // no chief: never ready
      } else {
        // A sync job at step 0: a pull for step 5, or a checkpoint at step
        // 100, waits for steps nobody takes.
        worker.create({{.name = "v", .shape = {4}}});
        worker.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2});
        std::vector<float> v(4);
        if (what == "sync pull")
          worker.pull({"v"}, {std::span<float>(v)}, 5);
        else
          worker.checkpoint(100);
      }
    });
    Client observer(o);
    auto connected = [&] {
      auto st = observer.stats()[0];
      const bool sync_job = what == "sync pull" || what == "checkpoint at a later step";
      return st.connections == 2 && (!sync_job || st.job.mode == SyncMode::kSync);
    };
    bool seen = false;
    for (auto waited = 0ms; waited < 10s && !(seen = connected()); waited += 10ms)
      std::this_thread::sleep_for(10ms);
    REQUIRE(seen);
    std::this_thread::sleep_for(300ms);  // the call is in psd, waiting
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    // psd sees the connection close and forgets the worker at once.
    uint32_t connections = 0;
    for (auto waited = 0ms; waited < 3s; waited += 10ms) {
      connections = observer.stats()[0].connections;
      if (connections == 1) break;
      std::this_thread::sleep_for(10ms);
    }
    CHECK(connections == 1);
  }
  CHECK_THAT(psd.log(), Catch::Contains("worker 1 (") && Catch::Contains(") disconnected"));
}

TEST_CASE("psd stopped with SIGTERM while a worker's call waits in it exits cleanly") {
  // The waiting call's service object is destroyed with the event loop,
  // after the Shard: it must not tell the Shard the worker left.
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  const pid_t child =
      fork_worker(o, [](Client& worker) { worker.wait_ready(600s); });  // no chief: never ready
  {
    Client observer(o);
    bool seen = false;
    for (auto waited = 0ms; waited < 10s && !(seen = observer.stats()[0].connections == 2);
         waited += 10ms) {
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(seen);
  }
  std::this_thread::sleep_for(200ms);  // the call is in psd, waiting
  CHECK(psd.stop() == 0);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST_CASE(
    "sync: a worker that dies after giving its gradient still counts it, and the step waits for "
    "the others") {
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  const TensorSpec v{.name = "v", .shape = {1}, .optimizer = OptimizerConfig::sgd(1.0f)};
  // Worker 1 gives its gradient for step 0 (1), then waits to be killed.
  const pid_t child = fork_worker(o, [&](Client& worker) {
    worker.wait_ready(10s);
    worker.declare({v});
    worker.push({"v"}, {std::vector<float>{1}}, 0);
    std::this_thread::sleep_for(60s);
  });
  ClientOptions c = o;
  c.worker_index = 0;
  c.is_chief = true;
  Client chief(c);
  chief.create({v});
  chief.init_job({.mode = SyncMode::kSync, .replicas_to_aggregate = 3, .total_replicas = 3});
  chief.set_ready();
  ClientOptions w2 = o;
  w2.worker_index = 2;
  Client worker2(w2);
  worker2.declare({v});
  bool pushed = false;
  for (auto waited = 0ms; waited < 10s && !pushed; waited += 10ms) {
    const auto stats = chief.stats();  // (a range over stats()[0].workers would outlive the vector)
    for (const auto& w : stats[0].workers)
      pushed = pushed || (w.worker_index == 1 && w.pushes >= 1);
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(pushed);
  CHECK(chief.push({"v"}, {std::vector<float>{2}}, 0).status[0] == PushStatus::kAccumulated);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  uint32_t connections = 0;
  for (auto waited = 0ms; waited < 3s && (connections = chief.stats()[0].connections) != 2;
       waited += 10ms) {
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(connections == 2);
  // Three replicas wanted, three gave or will give: worker 1's gradient
  // counts, and the step waits for worker 2's (worker 1 must not also be
  // counted as lost, closing the step with two and making worker 2's stale).
  CHECK(chief.stats()[0].global_step == 0);
  CHECK(worker2.push({"v"}, {std::vector<float>{4}}, 0).status[0] != PushStatus::kStale);
  std::vector<float> value(1);
  CHECK(worker2.pull({"v"}, {std::span<float>(value)}, 1).step == 1);
  CHECK(value[0] == Approx(-7.0 / 3.0));
}

TEST_CASE(
    "sync: a worker killed while its pull waits for the next step does not hold that step back") {
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  const JobConfig job{.mode = SyncMode::kSync, .replicas_to_aggregate = 2, .total_replicas = 2};
  // Worker 1 waits for the chief, then pulls for step 1, which waits for
  // step 0's gradients.
  const pid_t child = fork_worker(o, [](Client& worker) {
    worker.wait_ready(10s);
    worker.declare({{.name = "v", .shape = {4}}});
    std::vector<float> v(4);
    worker.pull({"v"}, {std::span<float>(v)}, 1);
  });
  ClientOptions c = o;
  c.worker_index = 0;
  c.is_chief = true;
  Client chief(c);
  chief.create({{.name = "v", .shape = {4}}});
  chief.init_job(job);
  chief.set_ready();
  bool waiting = false;
  for (auto waited = 0ms; waited < 10s && !waiting; waited += 10ms) {
    auto st = chief.stats()[0];
    waiting = st.connections == 2 && st.workers.size() == 2;
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(waiting);
  std::this_thread::sleep_for(300ms);  // worker 1's pull is in psd, waiting for step 1
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // Worker 1 is gone: step 0 completes with the chief's gradient alone.
  std::vector<float> g(4, 1.0f);
  chief.push({"v"}, {std::span<const float>(g)}, 0);
  CHECK(wait_for_step(chief, 1, 3s) == 1);
}

TEST_CASE(
    "a psd a test starts dies with the test process (a crashed test leaves no daemon listening)") {
  // This process adopts the orphaned psd for the while, so the test can
  // watch for its end and reap it. Undone, and the forked "test process"
  // stopped, however the case ends (a failed REQUIRE included).
  struct Cleanup {
    pid_t test_process = -1;
    ~Cleanup() {
      if (test_process > 0) {
        ::kill(test_process, SIGKILL);
        waitpid(test_process, nullptr, 0);
      }
      prctl(PR_SET_CHILD_SUBREAPER, 0);
    }
  } cleanup;
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  TempDir dir;
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const std::string psd_bin = ps::test::program_path("PSD_BIN");
  // The "test process": a fork that starts psd as every test does, then is
  // killed as a crash would kill it.
  const pid_t test_process = fork();
  REQUIRE(test_process >= 0);
  if (test_process > 0) cleanup.test_process = test_process;
  if (test_process == 0) {
    close(fds[0]);
    pid_t psd = -1;
    try {
      psd = ps::test::spawn_logged({psd_bin, "--port", "0"}, dir.path() + "/psd.log");
    } catch (...) {
    }
    (void)!write(fds[1], &psd, sizeof psd);
    pause();
    _exit(0);
  }
  close(fds[1]);
  pid_t psd = -1;
  const bool got = read(fds[0], &psd, sizeof psd) == static_cast<ssize_t>(sizeof psd);
  close(fds[0]);
  REQUIRE(got);
  REQUIRE(psd > 0);
  std::this_thread::sleep_for(200ms);  // psd running, its parent alive
  CHECK(::kill(psd, 0) == 0);
  ::kill(test_process, SIGKILL);
  waitpid(test_process, nullptr, 0);
  cleanup.test_process = -1;
  bool gone = false;
  for (auto waited = 0ms; waited < 5000ms && !gone; waited += 10ms) {
    gone = waitpid(psd, nullptr, WNOHANG) == psd;
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  if (!gone) {  // the failure case: stop the psd this test started
    ::kill(psd, SIGKILL);
    waitpid(psd, nullptr, 0);
  }
  CHECK(gone);
}

TEST_CASE(
    "a push given up at call_timeout sends nothing more from the caller's buffer, and the next "
    "call reconnects") {
  PsdProcess psd;
  Client client(gives_up_soon(psd));
  const std::size_t n = 4u << 20;  // 16 MiB: more than the sockets hold while psd is stopped
  client.create({{.name = "w", .shape = {n}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  std::vector<float> g(n, 1.0f);
  for (const bool async : {false, true}) {
    INFO((async ? "push_async" : "push"));
    const StoppedPsd stopped(psd.pid());
    auto push = [&] {
      const std::vector<std::string> names = {"w"};
      const std::vector<std::span<const float>> grads = {g};
      return async ? client.push_async(names, grads).get() : client.push(names, grads);
    };
    CHECK_THROWS_WITH(push(), Catch::Contains("no answer from psd"));
    // The call is over: its caller reuses the buffer. Nothing of this may
    // reach psd (no rest of the push may go out from it).
    std::fill(g.begin(), g.end(), 1000.0f);
    ::kill(psd.pid(), SIGCONT);
    std::this_thread::sleep_for(200ms);
    std::vector<float> w(n);
    client.pull("w", w);
    CHECK(std::count(w.begin(), w.end(), -1000.0f) == 0);
    std::fill(g.begin(), g.end(), 1.0f);
  }
  // The connection was cut; the next calls reconnect and work.
  std::vector<float> before(n), after(n);
  client.pull("w", before);
  const std::vector<float> half(n, 0.5f);
  client.push("w", half);
  client.pull("w", after);
  CHECK(after[0] == before[0] - 0.5f);
  CHECK(after[n - 1] == before[n - 1] - 0.5f);
}

TEST_CASE(
    "a push of rows given up at call_timeout sends nothing more from the caller's buffer, and "
    "the next call reconnects") {
  // Distinct ids to one shard go out from the caller's gradients
  // (PushGradients::rows), as a dense push's do.
  PsdProcess psd;
  Client client(gives_up_soon(psd));
  const uint32_t dim = 4;
  const std::size_t n = 1u << 20;  // 16 MiB of gradients: more than the sockets hold
  client.create_tables(
      {{.name = "t", .dim = dim, .rows = n, .optimizer = RowOptimizerConfig::sgd(1.0f)}});
  std::vector<int64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = int64_t(i);
  std::vector<float> g(n * dim, 1.0f);
  for (const bool async : {false, true}) {
    INFO((async ? "push_rows_async" : "push_rows"));
    const StoppedPsd stopped(psd.pid());
    auto push = [&] {
      return async ? client.push_rows_async("t", ids, g).get() : client.push_rows("t", ids, g);
    };
    CHECK_THROWS_WITH(push(), Catch::Contains("no answer from psd"));
    std::fill(g.begin(), g.end(), 1000.0f);  // the call is over: the caller reuses its buffer
    ::kill(psd.pid(), SIGCONT);
    std::this_thread::sleep_for(200ms);
    std::vector<float> rows(n * dim);
    client.pull_rows("t", ids, rows);
    CHECK(std::count_if(rows.begin(), rows.end(), [](float v) { return v <= -999.0f; }) == 0);
    std::fill(g.begin(), g.end(), 1.0f);
  }
  // The connection was cut; the next calls reconnect and work.
  std::vector<float> before(n * dim), after(n * dim);
  client.pull_rows("t", ids, before);
  std::fill(g.begin(), g.end(), 0.5f);
  client.push_rows("t", ids, g);
  client.pull_rows("t", ids, after);
  CHECK(after[0] == before[0] - 0.5f);
  CHECK(after[n * dim - 1] == before[n * dim - 1] - 0.5f);
}

namespace {

// Listens on 127.0.0.1:port (0: any free one), accepts (the kernel does)
// and never answers: a stopped psd, or something else on its port.
struct SilentListener {
  explicit SilentListener(int port = 0) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  ~SilentListener() { ::close(fd); }
  int fd = -1;
  std::string address;
};

}  // namespace

TEST_CASE(
    "a peer that accepts and never answers hello fails a connect or reconnect in bounded time") {
  using Clock = std::chrono::steady_clock;
  SECTION("connect") {
    SilentListener silent;
    ClientOptions o;
    o.ps_hosts = {silent.address};
    o.connect_timeout = 500ms;
    const auto start = Clock::now();
    CHECK_THROWS_WITH(Client(o), Catch::Contains("did not answer hello"));
    CHECK(Clock::now() - start < 10s);
  }
  SECTION("reconnect, after psd died and something silent took its port") {
    PsdProcess psd;
    ClientOptions o;
    o.ps_hosts = {psd.address()};
    o.prefer_unix_socket = false;
    o.connect_timeout = 500ms;
    o.reconnect_timeout = 1s;
    o.call_timeout = 30s;
    Client client(o);
    client.create({{.name = "w", .shape = {4}}});
    const int port = psd.port();
    psd.kill();
    SilentListener silent(port);
    const auto start = Clock::now();
    // Before, the reconnection waited for hello for good: the call failed
    // only at call_timeout (forever with none).
    CHECK_THROWS_WITH(client.pull("w"), Catch::Contains("did not answer hello"));
    CHECK(Clock::now() - start < 15s);
  }
}

TEST_CASE("a psd restarted empty under the client that created the model is said to have lost it") {
  // Before any step was counted (async, no step reports) the client knew the
  // model was there only because it had created it: a psd back empty then
  // gave "unknown tensor", not why.
  std::optional<PsdProcess> psd(std::in_place);
  ClientOptions o = gives_up_soon(*psd);
  Client client(o);
  client.create({{.name = "w", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  const std::vector<float> g(4, 1.0f);
  client.push({"w"}, {std::span<const float>(g)});
  const int port = psd->port();
  psd->kill();
  psd.emplace(std::vector<std::string>{}, port);  // no --checkpoint_dir: back empty
  CHECK_THROWS_WITH(client.push({"w"}, {std::span<const float>(g)}),
                    Catch::Contains("came back empty: psd restarted without a checkpoint"));
}

TEST_CASE("a psd holding only table rows is told apart from an empty one when it restarts") {
  TempDir dir;
  const std::vector<std::string> args = {"--checkpoint_dir", dir.path()};
  std::optional<PsdProcess> psd(std::in_place, args);
  ClientOptions o = gives_up_soon(*psd);
  o.worker_index = 0;
  o.is_chief = true;
  Client client(o);
  client.create_tables(
      {{.name = "e", .dim = 4, .rows = 10, .optimizer = RowOptimizerConfig::sgd(1.0f)}});
  client.set_ready();
  const std::vector<int64_t> ids = {1, 7};
  client.push_rows("e", ids, std::vector<float>(8, -1.0f));
  client.checkpoint();
  const int port = psd->port();
  SECTION("restored from its checkpoint: the rows are there") {
    psd->kill();
    psd.emplace(args, port);
    // Before, psd's hello counted dense tensors only: a shard of rows alone
    // was "back empty", and every call to it failed.
    std::vector<float> rows(8);
    client.pull_rows("e", ids, rows);
    CHECK(rows == std::vector<float>(8, 1.0f));
  }
  SECTION("back without a checkpoint: the model is lost, and said so") {
    psd->kill();
    psd.emplace(std::vector<std::string>{}, port);
    std::vector<float> rows(8);
    CHECK_THROWS_WITH(client.pull_rows("e", ids, rows),
                      Catch::Contains("came back empty: psd restarted without a checkpoint"));
  }
}

TEST_CASE(
    "a tables-only model created by this client, lost with a psd restarted empty, is said lost") {
  // No step and no ready flag: only the answered create_tables says the
  // shard held the model.
  std::optional<PsdProcess> psd(std::in_place);
  Client client(gives_up_soon(*psd));
  client.create_tables(
      {{.name = "e", .dim = 4, .rows = 10, .optimizer = RowOptimizerConfig::sgd(1.0f)}});
  const std::vector<int64_t> ids = {3};
  client.push_rows("e", ids, std::vector<float>(4, 1.0f));
  const int port = psd->port();
  psd->kill();
  psd.emplace(std::vector<std::string>{}, port);
  std::vector<float> rows(4);
  CHECK_THROWS_WITH(client.pull_rows("e", ids, rows),
                    Catch::Contains("came back empty: psd restarted without a checkpoint"));
}

TEST_CASE("a call after the Client sat idle longer than call_timeout gets its whole call_timeout") {
  // kj's timer reads the clock only when the loop runs, and nothing runs the
  // Client's loop between calls: the first call after 1.5 s idle must still
  // get its whole call_timeout of 1 s, not time out at once.
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.connect_timeout = 300ms;
  o.call_timeout = 1000ms;
  Client client(o);
  client.create({{.name = "w", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)}});
  for (const bool async : {false, true}) {
    INFO((async ? "pull_async" : "pull"));
    std::this_thread::sleep_for(1500ms);
    std::vector<float> w(4);
    if (async) {
      CHECK_NOTHROW(client.pull_async({"w"}, {std::span<float>(w)}).get());
    } else {
      CHECK_NOTHROW(client.pull("w", w));
    }
  }
  // And the timeout still fires for a psd that does not answer.
  const StoppedPsd stopped(psd.pid());
  std::this_thread::sleep_for(1500ms);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(client.pull("w"), Catch::Contains("no answer from psd within 1000 ms"));
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 900ms);
  CHECK(took < 5s);
}

TEST_CASE("futures of calls in flight when the Client is destroyed fail with ConnectionError") {
  PsdProcess psd;
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.connect_timeout = 300ms;
  std::vector<float> g(4, 1.0f), w(4);
  std::future<PushResult> push;
  std::future<PullResult> pull;
  {
    Client client(o);
    client.create({{.name = "w", .shape = {4}, .optimizer = OptimizerConfig::sgd(1.0f)}});
    ::kill(psd.pid(), SIGSTOP);  // nothing is answered
    push = client.push_async({"w"}, {std::span<const float>(g)});
    pull = client.pull_async({"w"}, {std::span<float>(w)});
  }
  ::kill(psd.pid(), SIGCONT);
  // Before: std::future_error ("Broken promise"), not a ps::Error.
  CHECK_THROWS_AS(push.get(), ConnectionError);
  CHECK_THROWS_WITH(pull.get(), Catch::Contains("destroyed with this call in flight"));
}
