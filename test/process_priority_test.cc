// psd --nice: every thread of psd at the asked priority; a value out of
// range, or one psd may not take, refused with a clear error at start.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/capability.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "test/psd_process.h"

using ps::test::program_path;
using ps::test::PsdProcess;
using ps::test::spawn_logged;
using ps::test::TempDir;

namespace {

// The nice value of each thread of `pid` (field 19 of its stat line,
// counted after the command name, which may hold spaces).
std::vector<int> thread_nice_values(pid_t pid) {
  std::vector<int> values;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream in(task.path() / "stat");
    std::string line;
    std::getline(in, line);
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i) {
    }
    values.push_back(std::stoi(field));
  }
  return values;
}

// A loopback port free a moment ago (a spec cannot say "any port").
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return ntohs(addr.sin_port);
}

struct Exit {
  int status = -1;  // exit status, or -1: killed or still running after 10 s
  std::string log;
};

// Runs psd with `args` in a child that first calls `prepare`
// (spawn_logged: false makes it exit 99), waits up to 10 s for it to end.
Exit run_psd(const std::vector<std::string>& args, const std::function<bool()>& prepare = {}) {
  TempDir dir;
  const std::string log = dir.path() + "/psd.log";
  std::vector<std::string> all = {program_path("PSD_BIN"), "--port", "0"};
  all.insert(all.end(), args.begin(), args.end());
  const pid_t pid = spawn_logged(all, log, prepare);
  Exit out;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) out.status = WEXITSTATUS(status);
  std::ifstream in(log);
  out.log.assign(std::istreambuf_iterator<char>(in), {});
  return out;
}

}  // namespace

TEST_CASE("psd --nice sets the priority of every one of its threads") {
  const int nice = std::min(19, getpriority(PRIO_PROCESS, 0) + 7);  // raising needs no privilege
  PsdProcess psd({"--nice", std::to_string(nice), "--threads", "2"});
  const auto values = thread_nice_values(psd.pid());
  REQUIRE(values.size() >= 3);  // the network thread and two compute threads
  for (int v : values) CHECK(v == nice);
  CHECK(psd.stop() == 0);
}

TEST_CASE("psd refuses a --nice out of range, before it listens") {
  for (const char* bad : {"20", "-21"}) {
    const Exit e = run_psd({"--nice", bad});
    CHECK(e.status == 2);
    CHECK_THAT(e.log, Catch::Contains("--nice must be in -20..19"));
    CHECK_THAT(e.log, !Catch::Contains("listening"));
  }
}

TEST_CASE("psd refuses a --nice it is not permitted to take, with the reason") {
  const int current = getpriority(PRIO_PROCESS, 0);
  if (current == -20) {
    WARN("this test already runs at nice -20: nothing below it to refuse");
    return;
  }
  // Below the current value needs CAP_SYS_NICE or RLIMIT_NICE: the child
  // gives up both (root: the capability leaves the bounding set, so exec
  // does not bring it back).
  const Exit e = run_psd({"--nice", "-20"}, [] {
    const rlimit none{0, 0};
    if (setrlimit(RLIMIT_NICE, &none) != 0) return false;
    if (geteuid() == 0 && prctl(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0) != 0) return false;
    return true;
  });
  if (e.status == 99) {
    WARN("could not drop CAP_SYS_NICE here (no CAP_SETPCAP?): not checked");
    return;
  }
  CHECK(e.status == 2);
  CHECK_THAT(e.log, Catch::Contains("--nice -20: Permission denied"));
  CHECK_THAT(e.log, Catch::Contains("CAP_SYS_NICE"));
  CHECK_THAT(e.log, !Catch::Contains("listening"));
}

TEST_CASE("a trainer's ps task (--job_name ps) takes --nice as psd does") {
  TempDir dir;
  const std::string port_file = dir.path() + "/port", log = dir.path() + "/ps.log";
  const int nice = std::min(19, getpriority(PRIO_PROCESS, 0) + 5);
  const pid_t pid = spawn_logged(
      {program_path("MNIST_TRAINER_BIN"), "--job_name", "ps", "--task_index", "0", "--ps_hosts",
       "127.0.0.1:" + std::to_string(free_port()), "--worker_hosts", "127.0.0.1:1", "--port_file",
       port_file, "--nice", std::to_string(nice), "--threads", "2"},
      log);
  bool listening = false;
  for (int i = 0; i < 500 && !listening; ++i) {
    listening = std::filesystem::exists(port_file) && std::filesystem::file_size(port_file) > 0;
    if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> values;
  if (listening) values = thread_nice_values(pid);
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in(log);
  INFO(std::string(std::istreambuf_iterator<char>(in), {}));
  REQUIRE(listening);
  REQUIRE(values.size() >= 3);
  for (int v : values) CHECK(v == nice);
}
