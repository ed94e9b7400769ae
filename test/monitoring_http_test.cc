// psd's HTTP side against a real psd process: /metrics after a short
// training run by several workers, and bad HTTP input.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <regex>
#include <thread>

#include <capnp/ez-rpc.h>

#include "test/http_test_util.h"
#include "test/prometheus_text_parser.h"
#include "schema/ps.capnp.h"
#include "ps/client.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PromText;
using ps::test::PsdProcess;

namespace {

// A psd with HTTP on a free port.
struct MonitoredPsd {
  ps::test::TempDir dir;
  PsdProcess psd{{"--http_port", "any", "--http_port_file", dir.path() + "/http_port"}};
  // psd writes the HTTP port file before the RPC one PsdProcess waits for.
  int http_port = ps::test::read_port_file(dir.path() + "/http_port");
};

ClientOptions worker_options(const PsdProcess& psd, int worker) {
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.worker_index = worker;
  return o;
}

std::vector<TensorSpec> model() {
  return {
      TensorSpec{.name = "w",
                 .shape = {4, 4},
                 .optimizer = OptimizerConfig::sgd(0.1f),
                 .init = InitConfig::constant(1)},
      TensorSpec{.name = "b", .shape = {4}, .optimizer = OptimizerConfig::sgd(0.1f), .init = {}}};
}

float loss_at(int worker, int step) { return 2.0f / float(step + 1) + 0.125f * float(worker); }

}  // namespace

TEST_CASE("/metrics is valid Prometheus text and counts a training run") {
  MonitoredPsd m;
  const int workers = 3, steps = 5;
  {
    Client chief(worker_options(m.psd, 0));
    chief.create(model());
  }
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < workers; ++i)
    clients.push_back(std::make_unique<Client>(worker_options(m.psd, i)));
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] {
      Client& c = *clients[i];
      c.declare(model());
      std::vector<float> w(16), b(4), gw(16, 0.5f), gb(4, 0.25f);
      for (int step = 0; step < steps; ++step) {
        c.pull({"w", "b"}, {w, b});
        c.push({"w", "b"}, {gw, gb}, step);
        c.report(step, loss_at(i, step), 0.5f + 0.1f * float(step), 1000.0f * float(i + 1), 0.1f);
      }
      c.stats();  // after the reports on the same connection: they have been handled
    });
  }
  for (auto& t : threads) t.join();

  auto answer = ps::test::http_get(m.http_port, "/metrics");
  REQUIRE(answer.status == 200);
  CHECK(answer.headers["content-type"].rfind("text/plain; version=0.0.4", 0) == 0);
  INFO(answer.body);
  PromText prom(answer.body);  // throws on any format violation

  const double n = workers * steps;
  CHECK(prom.value("ps_requests_total", {{"kind", "push"}}) == n);
  CHECK(prom.value("ps_requests_total", {{"kind", "pull"}}) == n);
  CHECK(prom.value("ps_requests_total", {{"kind", "report"}}) == n);
  CHECK(prom.value("ps_requests_total", {{"kind", "create"}}) == 1);
  CHECK(prom.value("ps_requests_total", {{"kind", "stats"}}) == workers);
  CHECK(prom.value("ps_requests_total", {{"kind", "hello"}}) == workers + 1);
  CHECK(prom.value("ps_requests_rejected_total") == 0);
  CHECK(prom.value("ps_tensors_pushed_total") == 2 * n);
  CHECK(prom.value("ps_tensors_pulled_total") == 2 * n);
  CHECK(prom.value("ps_received_bytes_total") == n * 20 * 4);
  CHECK(prom.value("ps_sent_bytes_total") == n * 20 * 4);
  CHECK(prom.value("ps_shared_memory_bytes_total") == 0);  // TCP clients, and 80-byte tensors
  CHECK(prom.value("ps_stale_gradients_total") == 0);
  CHECK(prom.value("ps_global_step") == 0);  // async, and nobody called stepDone
  CHECK(prom.value("ps_connected_workers") == workers);
  CHECK(prom.value("ps_connections") == workers);
  CHECK(prom.value("ps_tensors") == 2);
  CHECK(prom.value("ps_tensor_bytes") == 20 * 4);
  CHECK(prom.value("ps_last_checkpoint_step") == -1);
  CHECK(prom.value("ps_last_checkpoint_age_seconds") == -1);
  CHECK(prom.families().at("ps_shard_info").samples.at(0).labels.at("mode") == "async");
  for (int i = 0; i < workers; ++i) {
    const std::map<std::string, std::string> w = {{"worker", std::to_string(i)}};
    CHECK(prom.value("ps_worker_step", w) == steps - 1);
    CHECK(prom.value("ps_worker_connected", w) == 1);
    CHECK(prom.value("ps_worker_pushes_total", w) == 2 * steps);
    CHECK(prom.value("ps_worker_reported_step", w) == steps - 1);
    CHECK(prom.value("ps_worker_loss", w) == Approx(loss_at(i, steps - 1)));
    CHECK(prom.value("ps_worker_samples_per_second", w) == Approx(1000.0 * (i + 1)));
    CHECK(prom.value("ps_worker_learning_rate", w) == Approx(0.1));
  }
  // Every async push applies each tensor once.
  CHECK(prom.families().at("ps_apply_latency_seconds").type == "histogram");
  CHECK(prom.value("ps_apply_latency_seconds_count") == 2 * n);
  CHECK(*prom.value("ps_apply_latency_seconds_sum") > 0);
  // One staleness observation per worker push; the spread between workers
  // cannot exceed the run's length.
  CHECK(prom.value("ps_push_staleness_steps_count") == n);
  CHECK(prom.value("ps_push_staleness_steps_bucket", {{"le", "5"}}) == n);

  // The same numbers through the RPC stats call.
  Client tool(worker_options(m.psd, -1));
  auto st = tool.stats();
  CHECK(st.at(0).pushes == 2 * n);
}

TEST_CASE("sync mode: stale gradients and staleness against the global step") {
  MonitoredPsd m;
  // Raw RPC, to send a gradient for an old step on purpose.
  struct RawWorker {
    RawWorker(const PsdProcess& psd, int index)
        : rpc(psd.address()), shard(rpc.getMain<wire::Shard>()) {
      auto req = shard.helloRequest();
      req.setProtocolVersion(wire::K_PROTOCOL_VERSION);
      req.setWorkerIndex(index);
      req.setIsChief(index == 0);
      req.send().wait(rpc.getWaitScope());
    }
    wire::PushStatus push(int64_t step) {
      auto req = shard.pushRequest();
      req.setStep(step);
      auto g = req.initGrads(1);
      g[0].setName("w");
      const float grad[2] = {1, 1};
      g[0].setValues(kj::arrayPtr(reinterpret_cast<const kj::byte*>(grad), sizeof(grad)));
      return req.send().wait(rpc.getWaitScope()).getStatus()[0];
    }
    capnp::EzRpcClient rpc;
    wire::Shard::Client shard;
  };
  RawWorker chief(m.psd, 0), other(m.psd, 1);
  {
    auto& ws = chief.rpc.getWaitScope();
    auto init = chief.shard.initJobRequest();
    init.getConfig().setMode(wire::SyncMode::SYNC);
    init.getConfig().setReplicasToAggregate(2);
    init.getConfig().setTotalReplicas(2);
    init.send().wait(ws);
    auto create = chief.shard.createRequest();
    auto spec = create.initSpecs(1)[0];
    spec.setName("w");
    spec.initShape(1).set(0, 2);
    create.send().wait(ws);
    chief.shard.setReadyRequest().send().wait(ws);
  }
  CHECK(chief.push(0) == wire::PushStatus::ACCUMULATED);
  CHECK(other.push(0) == wire::PushStatus::ACCUMULATED);  // step 0 complete: global step 1
  CHECK(other.push(0) == wire::PushStatus::STALE);        // one step late

  auto answer = ps::test::http_get(m.http_port, "/metrics");
  REQUIRE(answer.status == 200);
  INFO(answer.body);
  PromText prom(answer.body);
  CHECK(prom.families().at("ps_shard_info").samples.at(0).labels.at("mode") == "sync");
  CHECK(prom.value("ps_global_step") == 1);
  CHECK(prom.value("ps_sync_steps_applied_total") == 1);
  CHECK(prom.value("ps_stale_gradients_total") == 1);
  CHECK(prom.value("ps_push_staleness_steps_count") == 3);
  CHECK(prom.value("ps_push_staleness_steps_bucket", {{"le", "0"}}) == 2);
  CHECK(prom.value("ps_push_staleness_steps_bucket", {{"le", "1"}}) == 3);
  CHECK(prom.value("ps_push_staleness_steps_sum") == 1);
  CHECK(prom.value("ps_job_ready") == 1);
  // The step's average is applied once; the late gradient is not.
  CHECK(prom.value("ps_apply_latency_seconds_count") == 1);
}

TEST_CASE("bad HTTP input gets a 4xx and psd serves on") {
  MonitoredPsd m;
  Client client(worker_options(m.psd, -1));
  client.create(model());
  const std::string big(1 << 20, 'a');
  struct Case {
    std::string what, request;
    std::vector<int> expected;
  };
  const std::vector<Case> cases = {
      {"unknown path", "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", {404}},
      {"POST", "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", {405}},
      {"DELETE", "DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", {405}},
      {"garbage", "GARBAGE\r\n\r\n", {400}},
      {"binary", std::string("\x00\x01\x02\xff\xfe\r\n\r\n", 9), {400}},
      {"header without colon", "GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", {400}},
      {"1 MiB header",
       "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n",
       {400, 431}},
      {"1 MiB URL", "GET /" + big + " HTTP/1.1\r\nHost: x\r\n\r\n", {400, 414, 431}},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    auto answer = ps::test::http_exchange(m.http_port, c.request);
    INFO(answer.raw.substr(0, 200));
    CHECK(std::find(c.expected.begin(), c.expected.end(), answer.status) != c.expected.end());
    // ... and the daemon serves on, HTTP and RPC.
    auto health = ps::test::http_get(m.http_port, "/healthz");
    CHECK(health.status == 200);
    CHECK(health.body == "ok\n");
    CHECK(client.pull("b") == std::vector<float>(4, 0.0f));
  }
  auto head = ps::test::http_get(m.http_port, "/metrics", "HEAD");
  CHECK(head.status == 200);
  CHECK(head.body.empty());
  CHECK(ps::test::http_get(m.http_port, "/status.json").headers["content-type"] ==
        "application/json");
  CHECK(m.psd.alive());
}

TEST_CASE("a flood of bad HTTP requests writes a few log lines, not one each") {
  MonitoredPsd m;
  const auto count = ps::test::count_of;
  for (int i = 0; i < 60; ++i)
    CHECK(ps::test::http_exchange(m.http_port, "GARBAGE\r\n\r\n").status == 400);
  const std::string big_head =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(140 << 10, 'a') + "\r\n\r\n";
  for (int i = 0; i < 12; ++i) ps::test::http_exchange(m.http_port, big_head);
  // Idle connections past the 64 psd serves: each newcomer closes the oldest.
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(ps::test::tcp_connect(m.http_port));
  CHECK(ps::test::http_get(m.http_port, "/healthz").status == 200);
  for (int fd : idle)
    if (fd >= 0) ::close(fd);
  const std::string log = m.psd.log();
  INFO(log.substr(0, 3000));
  // Before: one line per malformed request, per eviction, and three per oversized head.
  CHECK(count(log, "refused a malformed request") <= 6);
  CHECK(count(log, "with a head over 128 KiB") <= 6);
  CHECK(count(log, "HttpService threw") <= 6);
  CHECK(count(log, "closing the oldest") <= 6);
  CHECK(count(log, "stack:") == 0);
}

TEST_CASE("/status.json stays valid JSON text whatever bytes a tensor name holds") {
  MonitoredPsd m;
  Client client(worker_options(m.psd, 0));
  // (Control characters are refused in names: docs/hardening.md.)
  const std::string name = std::string("a\"b\\cd") + "\xff\xfe" + "<e>" + "\xc3\xa9";  // é is kept
  client.create({TensorSpec{.name = name, .shape = {1}}});
  auto answer = ps::test::http_get(m.http_port, "/status.json");
  REQUIRE(answer.status == 200);
  CHECK_THAT(answer.body, Catch::Contains(R"("a\"b\\cd\ufffd\ufffd<e>)"
                                          "\xc3\xa9\""));
  CHECK(answer.body.find('\xff') == std::string::npos);  // JSON text is UTF-8
}

namespace {

// Whether `s` is UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool is_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (std::size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3f);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

}  // namespace

// Prometheus refuses a whole scrape whose label value is not UTF-8.
TEST_CASE("/metrics stays UTF-8 whatever bytes a table name holds") {
  MonitoredPsd m;
  Client client(worker_options(m.psd, -1));
  const std::string name = std::string("t\"\\") + "\xff\xc3" + "<\xc3\xa9>" + "\xed\xa0\x80";
  client.create_tables({TableSpec{.name = name, .dim = 2, .rows = 4}});
  auto answer = ps::test::http_get(m.http_port, "/metrics");
  REQUIRE(answer.status == 200);
  CHECK(is_utf8(answer.body));
  PromText prom(answer.body);
  const std::string shown = std::string("t\"\\") + "\xef\xbf\xbd\xef\xbf\xbd" + "<\xc3\xa9>" +
                            "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd";
  CHECK(prom.value("ps_table_rows", {{"table", shown}}) == 4);
  CHECK(is_utf8(ps::test::http_get(m.http_port, "/status.json").body));
}

TEST_CASE(
    "/metrics and /status.json show each embedding table's rows, bytes, traffic and evictions") {
  MonitoredPsd m;
  Client client(worker_options(m.psd, -1));
  const TableSpec expiring{.name = "exp",
                           .dim = 1,
                           .dynamic = true,
                           .placement = TablePlacement::kHash,
                           .expire_after_steps = 1};
  client.create_tables({TableSpec{.name = "fixed", .dim = 4, .rows = 10},
                        TableSpec{.name = "dyn",
                                  .dim = 2,
                                  .dynamic = true,
                                  .placement = TablePlacement::kHash,
                                  .row_limit = 3,
                                  .on_limit = OnRowLimit::kEvictLru},
                        TableSpec{.name = "adm",
                                  .dim = 2,
                                  .dynamic = true,
                                  .placement = TablePlacement::kHash,
                                  .min_count = 3},
                        expiring});
  for (int i = 0; i < 3; ++i)  // the third push admits both ids
    client.push_rows("adm", std::vector<int64_t>{7, 8}, std::vector<float>(4, 1.0f));
  std::vector<float> out(5 * 4);
  client.pull_rows("fixed", std::vector<int64_t>{1, 2, 3, 4, 5}, out);
  client.push_rows("fixed", std::vector<int64_t>{1, 2}, std::vector<float>(8, 1.0f));
  client.push_rows("dyn", std::vector<int64_t>{10, 11, 12}, std::vector<float>(6, 1.0f));
  client.push_rows("dyn", std::vector<int64_t>{13, 14},
                   std::vector<float>(4, 1.0f));  // 10 and 11 evicted
  {  // Two rows of "exp", untouched for its one step, expire once a worker's step is done.
    ClientOptions chief = worker_options(m.psd, 0);
    chief.is_chief = true;
    Client worker(chief);
    worker.init_job({.mode = SyncMode::kAsync});
    worker.declare_tables({expiring});
    worker.set_ready();
    worker.push_rows("exp", std::vector<int64_t>{1, 2}, std::vector<float>(2, 1.0f));
    worker.step_done(0);
  }
  auto answer = ps::test::http_get(m.http_port, "/metrics");
  REQUIRE(answer.status == 200);
  INFO(answer.body);
  PromText prom(answer.body);
  const std::map<std::string, std::string> f = {{"table", "fixed"}}, d = {{"table", "dyn"}};
  CHECK(prom.value("ps_table_rows_expired_total", {{"table", "exp"}}) == 2);
  CHECK(prom.value("ps_table_rows_expired_total", d) == 0);
  CHECK(prom.value("ps_table_rows", {{"table", "exp"}}) == 0);
  CHECK(prom.value("ps_table_rows", f) == 10);
  CHECK(prom.value("ps_table_rows", d) == 3);
  CHECK(prom.value("ps_table_bytes", f) >= 10 * 4 * 4);
  CHECK(prom.value("ps_table_rows_pulled_total", f) == 5);
  CHECK(prom.value("ps_table_rows_pushed_total", f) == 2);
  CHECK(prom.value("ps_table_rows_pushed_total", d) == 5);
  CHECK(prom.value("ps_table_evictions_total", d) == 2);
  CHECK(prom.value("ps_table_evictions_total", f) == 0);
  const std::map<std::string, std::string> a = {{"table", "adm"}};
  CHECK(prom.value("ps_table_ids_filtered_total", a) == 4);
  CHECK(prom.value("ps_table_ids_filtered_total", d) == 0);
  CHECK(prom.value("ps_table_rows", a) == 2);
  CHECK(prom.value("ps_table_bytes", a) >= 4u << 20);  // the count sketch's 4 MiB
  CHECK(prom.value("ps_requests_total", {{"kind", "pullRows"}}) == 1);
  auto status = ps::test::http_get(m.http_port, "/status.json");
  REQUIRE(status.status == 200);
  CHECK(status.body.find("{\"name\":\"dyn\",\"dim\":2,\"dynamic\":true,\"rows\":3,") !=
        std::string::npos);
  CHECK(
      status.body.find("\"rows_pulled\":5,\"rows_pushed\":2,\"evictions\":0,\"ids_filtered\":0,") !=
      std::string::npos);
  CHECK(status.body.find(
            "\"rows_pushed\":6,\"evictions\":0,\"ids_filtered\":4,\"rows_expired\":0}") !=
        std::string::npos);
  CHECK(status.body.find(
            "\"rows_pushed\":2,\"evictions\":0,\"ids_filtered\":0,\"rows_expired\":2}") !=
        std::string::npos);
}

namespace {

// The raw JSON text of `key`'s value in a flat status.json member ("null", "12", ...).
std::string json_value(const std::string& body, const std::string& key) {
  std::smatch m;
  if (std::regex_search(body, m, std::regex("\"" + key + "\":([^,\\]}]*)"))) return m[1].str();
  return "";
}
double json_number(const std::string& body, const std::string& key) {
  const std::string v = json_value(body, key);
  INFO(key << " = '" << v << "'");
  REQUIRE(!v.empty());
  REQUIRE(v != "null");
  return std::stod(v);
}

}  // namespace

TEST_CASE("/status.json gives the job's progress, steps/s, ETA, samples/s and workers seen") {
  MonitoredPsd m;
  // No job yet: no progress, no ETA, no workers.
  auto idle = ps::test::http_get(m.http_port, "/status.json");
  REQUIRE(idle.status == 200);
  CHECK(json_value(idle.body, "configured") == "false");
  CHECK(json_value(idle.body, "progress") == "null");
  CHECK(json_value(idle.body, "eta_secs") == "null");
  CHECK(json_value(idle.body, "workers_seen") == "0");

  const int64_t stop = 100000;
  std::vector<std::unique_ptr<Client>> workers;
  for (int i = 0; i < 2; ++i) {
    ClientOptions o = worker_options(m.psd, i);
    o.is_chief = i == 0;
    workers.push_back(std::make_unique<Client>(o));
  }
  workers[0]->init_job(
      JobConfig{.mode = SyncMode::kAsync, .total_replicas = 2, .train_steps = stop});
  workers[0]->create(model());
  workers[0]->set_ready();
  workers[1]->declare(model());
  // A little over two seconds of steps, so the one-second history holds a rate.
  std::vector<float> w(16), b(4), gw(16, 0.001f), gb(4, 0.001f);
  const auto start = std::chrono::steady_clock::now();
  int64_t local = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2300)) {
    ++local;
    for (int i = 0; i < 2; ++i) {
      workers[i]->pull({"w", "b"}, {w, b});
      workers[i]->push_and_step({"w", "b"}, {gw, gb}, local - 1, local);
      workers[i]->report(local, 1.0f, 0.5f, 1500.0f * float(i + 1), 0.1f);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& c : workers) c->stats();  // the reports have been handled

  auto answer = ps::test::http_get(m.http_port, "/status.json");
  REQUIRE(answer.status == 200);
  INFO(answer.body.substr(0, 1500));
  const double step = json_number(answer.body, "global_step");
  CHECK(step >= 2 * 10);
  CHECK(json_number(answer.body, "train_steps") == stop);
  CHECK(json_number(answer.body, "progress") == Approx(step / stop).epsilon(1e-9));
  const double rate = json_number(answer.body, "steps_per_sec");
  // Measured over the last (at most 10) seconds: between 0 and all steps in one second.
  CHECK(rate > 0);
  CHECK(rate <= step);
  CHECK(json_number(answer.body, "eta_secs") == Approx((stop - step) / rate).epsilon(1e-6));
  CHECK(json_number(answer.body, "samples_per_sec") == Approx(1500.0 + 3000.0));
  CHECK(json_value(answer.body, "workers_seen") == "2");
  CHECK(json_value(answer.body, "workers_connected") == "2");

  // Worker 1 leaves: seen still, no longer connected, its samples/s no longer counted.
  workers[1].reset();
  for (int i = 0; i < 50; ++i) {
    answer = ps::test::http_get(m.http_port, "/status.json");
    if (json_value(answer.body, "workers_connected") == "1") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(json_value(answer.body, "workers_connected") == "1");
  CHECK(json_value(answer.body, "workers_seen") == "2");
  CHECK(json_number(answer.body, "samples_per_sec") == Approx(1500.0));
}
