// psd's status page in headless Chromium: the page served by a real psd,
// after a short training run by two workers, must show the worker rows and
// draw its charts (the script sets data-rendered="1" on a canvas once it has
// drawn data). Saves a screenshot (status_page.png in $PS_ARTIFACT_DIR).
// Exits 77 (meson: SKIP) where Chromium is not installed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>
#include <thread>

#include "test/http_test_util.h"
#include "ps/client.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;

namespace {

std::string chromium_path() {
  if (const char* p = std::getenv("CHROMIUM_BIN"); p && *p) return p;
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// Runs a program with stdout to `out_path`, stopping it (by PID) after
// `timeout_s`; returns its exit status, or -1 if it had to be killed.
int run_program(const std::vector<std::string>& args, const std::string& out_path, int timeout_s) {
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    int null = ::open("/dev/null", O_WRONLY);
    dup2(null, 2);  // Chromium is chatty on stderr (dbus, GPU) even when all is well
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  for (int waited_ms = 0; waited_ms < timeout_s * 1000; waited_ms += 50) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

std::vector<std::string> chromium_args(const std::string& profile_dir) {
  return {chromium_path(),
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
          "--disable-dev-shm-usage",
          "--user-data-dir=" + profile_dir,
          "--window-size=1280,1000",
          "--virtual-time-budget=5000"};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string canvas_tag(const std::string& dom, const std::string& id) {
  std::smatch m;
  if (std::regex_search(dom, m, std::regex("<canvas[^>]*id=\"" + id + "\"[^>]*>"))) return m.str();
  return "";
}

}  // namespace

TEST_CASE("the status page shows the workers and draws its charts in Chromium") {
  ps::test::TempDir dir;
  PsdProcess psd({"--http_port", "any", "--http_port_file", dir.path() + "/http_port"});
  const int http_port = ps::test::read_port_file(dir.path() + "/http_port");

  const std::vector<TensorSpec> model = {TensorSpec{.name = "layer1/weights",
                                                    .shape = {64, 32},
                                                    .optimizer = OptimizerConfig::sgd(0.1f),
                                                    .init = {}},
                                         TensorSpec{.name = "layer1/bias",
                                                    .shape = {32},
                                                    .optimizer = OptimizerConfig::sgd(0.1f),
                                                    .init = {}}};
  std::vector<std::unique_ptr<Client>> workers;
  for (int i = 0; i < 2; ++i) {
    ClientOptions o;
    o.ps_hosts = {psd.address()};
    o.worker_index = i;
    workers.push_back(std::make_unique<Client>(o));
    workers.back()->create(model);
  }
  // An embedding table: 100 rows pulled and pushed once, 40 more pushed once (min_count 2).
  workers[0]->create_tables({TableSpec{.name = "emb",
                                       .dim = 4,
                                       .dynamic = true,
                                       .placement = TablePlacement::kHash,
                                       .min_count = 2}});
  std::vector<int64_t> ids(100), later(40);
  std::iota(ids.begin(), ids.end(), 0);
  std::iota(later.begin(), later.end(), 1000);
  std::vector<float> rows(ids.size() * 4), grads(ids.size() * 4, 0.5f);
  workers[0]->push_rows("emb", ids, grads);  // counted, not admitted
  workers[0]->push_rows("emb", ids, grads);  // admitted
  workers[0]->pull_rows("emb", ids, rows);
  workers[0]->push_rows("emb", later, std::span<const float>(grads).first(later.size() * 4));
  // About two seconds of training, so the one-second history has rates to chart.
  std::vector<float> w(64 * 32), b(32), gw(64 * 32, 0.01f), gb(32, 0.01f);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2200);
       ++step) {
    for (int i = 0; i < 2; ++i) {
      workers[i]->pull({"layer1/weights", "layer1/bias"}, {w, b});
      workers[i]->push({"layer1/weights", "layer1/bias"}, {gw, gb}, step);
      workers[i]->report(step, 2.0f / float(step + 1) + 0.1f * float(i), 0.9f, 512.0f, 0.1f);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : workers) c->stats();  // the reports have been handled

  const std::string url = "http://127.0.0.1:" + std::to_string(http_port) + "/";
  auto args = chromium_args(dir.path() + "/profile");
  args.push_back("--dump-dom");
  args.push_back(url);
  const std::string dom_path = dir.path() + "/dom.html";
  REQUIRE(run_program(args, dom_path, 60) == 0);
  const std::string dom = read_file(dom_path);
  INFO(dom.substr(0, 4000));
  CHECK(dom.find("data-loaded=\"1\"") != std::string::npos);
  CHECK(dom.find("<tr data-worker=\"0\"") != std::string::npos);
  CHECK(dom.find("<tr data-worker=\"1\"") != std::string::npos);
  CHECK(dom.find("data-tensor=\"layer1/weights\"") != std::string::npos);
  // name, kind, dim, rows, bytes, rows pulled, pulled / s, rows pushed, pushed / s, evictions,
  // ids filtered, rows expired
  std::smatch table_row;
  REQUIRE(std::regex_search(dom, table_row, std::regex("<tr data-table=\"emb\">.*?</tr>")));
  INFO(table_row.str());
  CHECK(std::regex_search(
      table_row.str(),
      std::regex(
          "<td>emb</td><td>dynamic</td><td class=\"num\">4</td><td class=\"num\">100</td>"
          "<td class=\"num\">[^<]*iB</td><td class=\"num\">100</td><td class=\"num\">(0|–)</td>"
          "<td class=\"num\">240</td><td class=\"num\">(0|–)</td><td class=\"num\">0</td>"
          "<td class=\"num\">140</td><td class=\"num\">0</td>")));
  for (const char* chart : {"chart-steps", "chart-bytes", "chart-loss"}) {
    INFO(chart);
    CHECK(canvas_tag(dom, chart).find("data-rendered=\"1\"") != std::string::npos);
  }

  // A screenshot for people to look at (and keep as a CI artifact).
  const char* artifacts = std::getenv("PS_ARTIFACT_DIR");
  const std::string shot =
      std::string(artifacts && *artifacts ? artifacts : ".") + "/status_page.png";
  std::filesystem::remove(shot);
  auto shot_args = chromium_args(dir.path() + "/profile");
  shot_args.push_back("--screenshot=" + shot);
  shot_args.push_back(url);
  CHECK(run_program(shot_args, dir.path() + "/screenshot.log", 60) == 0);
  CHECK(std::filesystem::exists(shot));
  CHECK(psd.alive());
}

namespace {

// The page as Chromium has rendered it after a few polls.
std::string dump_dom(const std::string& url, const std::string& dir) {
  auto args = chromium_args(dir + "/profile");
  args.push_back("--dump-dom");
  args.push_back(url);
  const std::string dom_path = dir + "/dom.html";
  REQUIRE(run_program(args, dom_path, 60) == 0);
  return read_file(dom_path);
}

// The text of the element with `id` (no nested tags in the ones asked for).
std::string element_text(const std::string& dom, const std::string& id) {
  std::smatch m;
  if (std::regex_search(dom, m, std::regex("id=\"" + id + "\"[^>]*>([^<]*)<"))) return m[1].str();
  return "<no element " + id + ">";
}

std::string attribute(const std::string& tag, const std::string& name) {
  std::smatch m;
  if (std::regex_search(tag, m, std::regex(name + "=\"([^\"]*)\""))) return m[1].str();
  return "";
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("the status page: mode only once a job exists, no repeats, terminal units, progress") {
  ps::test::TempDir dir;
  PsdProcess psd({"--http_port", "any", "--http_port_file", dir.path() + "/http_port"});
  const int http_port = ps::test::read_port_file(dir.path() + "/http_port");
  const std::string url = "http://127.0.0.1:" + std::to_string(http_port) + "/";

  // No job, no traffic: no mode yet, and an idle byte axis with distinct labels.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two history samples
  {
    const std::string dom = dump_dom(url, dir.path());
    INFO(dom.substr(0, 3000));
    CHECK(element_text(dom, "c-mode") == "–");
    CHECK(element_text(dom, "job") == "no job yet");
    const std::string bytes = canvas_tag(dom, "chart-bytes");
    CHECK(attribute(bytes, "data-rendered") == "1");
    const std::string labels = attribute(bytes, "data-labels");
    INFO("byte axis labels: " << labels);
    CHECK(labels == "0 B|256 B|512 B|768 B|1.0 KiB");
  }

  // A job of two workers reporting 40,700 and 1,250,000 samples/s.
  std::vector<std::unique_ptr<Client>> workers;
  for (int i = 0; i < 2; ++i) {
    ClientOptions o;
    o.ps_hosts = {psd.address()};
    o.worker_index = i;
    o.is_chief = i == 0;
    workers.push_back(std::make_unique<Client>(o));
  }
  workers[0]->init_job(
      JobConfig{.mode = SyncMode::kAsync, .total_replicas = 2, .train_steps = 1000000});
  const std::vector<TensorSpec> model = {
      TensorSpec{.name = "w", .shape = {256}, .optimizer = OptimizerConfig::sgd(0.1f), .init = {}}};
  workers[0]->create(model);
  workers[0]->set_ready();
  workers[1]->declare(model);
  std::vector<float> w(256), g(256, 0.001f);
  const float rates[2] = {40700.0f, 1250000.0f};
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2300);
       ++step) {
    for (int i = 0; i < 2; ++i) {
      workers[i]->pull("w", std::span<float>(w));
      workers[i]->push_and_step({"w"}, {std::span<const float>(g)}, step - 1, step);
      workers[i]->report(step, 0.5f, 0.9f, rates[i], 0.0002f);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& c : workers) c->stats();
  const std::string dom = dump_dom(url, dir.path());
  INFO(dom.substr(0, 4000));
  CHECK(element_text(dom, "c-mode") == "async");
  const std::string title = element_text(dom, "title"), job = element_text(dom, "job");
  INFO("header: " << title << " / " << job);
  CHECK(count(title + job, "psd") == 1);
  CHECK(count(title + job, "stop") == 1);
  CHECK(count(title + job, "async") == 1);
  CHECK(job == "job: async, 2 workers, stop at step 1000000");
  // Progress and ETA: a small fraction of a million steps, hours away.
  const std::string progress = element_text(dom, "c-progress");
  CHECK(std::regex_match(progress, std::regex("0\\.[0-9]%, ETA [0-9]+h[0-9]{2}m[0-9]{2}s")));
  // The terminal's units: 40.7k and 1.25M, the sum 1.29M; no exponents anywhere.
  CHECK(element_text(dom, "c-samples") == "1.29M");
  CHECK(dom.find(">40.7k<") != std::string::npos);
  CHECK(dom.find(">1.25M<") != std::string::npos);
  CHECK(dom.find(">0.000200<") != std::string::npos);  // the learning rate
  CHECK(!std::regex_search(dom, std::regex(">[0-9.]+e[+-][0-9]+<")));
  CHECK(element_text(dom, "c-workers") == "2 of 2 seen");
  CHECK(psd.alive());
}

TEST_CASE("psd 0's page with ?shards= shows every shard's step, workers and a link to its page") {
  ps::test::TempDir dir;
  std::vector<std::unique_ptr<PsdProcess>> psds;
  std::vector<int> http_ports;
  for (int i = 0; i < 2; ++i) {
    const std::string port_file = dir.path() + "/http_port" + std::to_string(i);
    psds.push_back(std::make_unique<PsdProcess>(
        std::vector<std::string>{"--shard_index", std::to_string(i), "--num_shards", "2",
                                 "--http_port", "any", "--http_port_file", port_file}));
    http_ports.push_back(ps::test::read_port_file(port_file));
  }
  // The pages of the other shards may read /status.json (no HTTP token here).
  CHECK(ps::test::http_get(http_ports[1], "/status.json").headers["access-control-allow-origin"] ==
        "*");

  // One chief, a tensor on each shard, 7 steps.
  ClientOptions o;
  o.ps_hosts = {psds[0]->address(), psds[1]->address()};
  o.worker_index = 0;
  o.is_chief = true;
  Client chief(o);
  chief.init_job(JobConfig{.mode = SyncMode::kAsync, .total_replicas = 1, .train_steps = 100});
  std::vector<TensorSpec> model;
  for (const char* name : {"a", "b", "c", "d"})
    model.push_back(TensorSpec{
        .name = name, .shape = {16}, .optimizer = OptimizerConfig::sgd(0.1f), .init = {}});
  chief.create(model);
  chief.set_ready();
  std::vector<float> g(16, 0.01f);
  for (int64_t step = 1; step <= 7; ++step)
    chief.push_and_step({"a", "b", "c", "d"}, {g, g, g, g}, step - 1, step);
  chief.stats();

  // Each shard's own answer, to compare the table with.
  std::vector<std::string> steps;
  for (int port : http_ports) {
    std::smatch m;
    const std::string json = ps::test::http_get(port, "/status.json").body;
    REQUIRE(std::regex_search(json, m, std::regex("\"global_step\":([0-9]+)")));
    steps.push_back(m[1].str());
  }
  INFO("global steps: " << steps[0] << ", " << steps[1]);
  CHECK(steps[1] == "7");

  // Shard 1, a dead address (port 1: nothing listens) and one that is no address at all.
  const std::string peer = "127.0.0.1:" + std::to_string(http_ports[1]);
  const std::string url = "http://127.0.0.1:" + std::to_string(http_ports[0]) + "/?shards=" + peer +
                          ",127.0.0.1:1,javascript:alert(1)";
  const std::string dom = dump_dom(url, dir.path());
  INFO(dom.substr(std::min(dom.size(), dom.find("<section id=\"shards-section\"")), 2500));
  std::smatch row;
  for (int i = 0; i < 2; ++i) {
    const std::string address = "127.0.0.1:" + std::to_string(http_ports[i]);
    INFO("shard " << i << " at " << address);
    REQUIRE(std::regex_search(dom, row,
                              std::regex("<tr data-shard=\"" + address + "\"[^>]*>(.*?)</tr>")));
    const std::string cells = row[1].str();
    CHECK(cells.find("<td>" + std::to_string(i) + " of 2</td>") != std::string::npos);
    CHECK(cells.find("<a href=\"http://" + address + "/\">") != std::string::npos);
    CHECK(cells.find(">" + steps[i] + " of 100</td>") != std::string::npos);
    CHECK(cells.find(">1 of 1 seen</td>") != std::string::npos);
    CHECK(cells.find("<td>training</td>") != std::string::npos);
  }
  REQUIRE(
      std::regex_search(dom, row, std::regex("<tr data-shard=\"127.0.0.1:1\"[^>]*>(.*?)</tr>")));
  CHECK(row[1].str().find("unreachable") != std::string::npos);
  CHECK(dom.find("data-shard=\"javascript") == std::string::npos);
  CHECK(element_text(dom, "error") ==
        "ignored ?shards= entry (not host:port): javascript:alert(1)");
  CHECK(psds[0]->alive());
  CHECK(psds[1]->alive());
}

TEST_CASE("with an HTTP token, /status.json is for its own page only (no CORS header)") {
  ps::test::TempDir dir;
  const std::string token_file = dir.path() + "/token";
  std::ofstream(token_file) << "page-secret\n";
  ::chmod(token_file.c_str(), 0600);
  PsdProcess psd({"--http_port", "any", "--http_port_file", dir.path() + "/http_port",
                  "--http_auth_token_file", token_file});
  const int http_port = ps::test::read_port_file(dir.path() + "/http_port");
  auto answer = ps::test::http_exchange(
      http_port,
      "GET /status.json HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer page-secret\r\n\r\n");
  CHECK(answer.status == 200);
  CHECK(answer.headers.count("access-control-allow-origin") == 0);
}

int main(int argc, char** argv) {
  if (chromium_path().empty()) {
    std::printf(
        "SKIP: Chromium not found (/usr/bin/chromium; apt-get install chromium, or set "
        "CHROMIUM_BIN)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
