// psd's status page in headless Chromium: the page served by a real psd,
// after a short training run by two workers, must show the worker rows and
// draw its charts (the script sets data-rendered="1" on a canvas once it has
// drawn data). Saves a screenshot (status_page.png in $PS_ARTIFACT_DIR).
// Exits 77 (meson: SKIP) where Chromium is not installed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

int main(int argc, char** argv) {
  if (chromium_path().empty()) {
    std::printf(
        "SKIP: Chromium not found (/usr/bin/chromium; apt-get install chromium, or set "
        "CHROMIUM_BIN)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
