#include "test/psd_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ps::test {

std::string program_path(const char* env_var) {
  const char* p = std::getenv(env_var);
  if (!p || !*p)
    throw std::runtime_error(std::string("environment variable ") + env_var +
                             " is not set (run through meson test)");
  return p;
}

namespace {

// The thread about to fork, for die_with_parent: the death signal follows
// the thread that forked, not the process.
struct Forker {
  pid_t parent = getpid();
  bool main_thread = gettid() == getpid();
};

// In a child: SIGKILL when the test process dies (a crash, a Ctrl-C, an
// aborted run), so no psd or worker outlives it. Only for children forked
// from the main thread, which lives as long as the process: a helper
// thread (one that starts psd late, say) may end long before its child
// should.
void die_with_parent(const Forker& forker) {
  if (!forker.main_thread) return;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != forker.parent) _exit(98);  // died before the signal was set
}

}  // namespace

int run_push_workers(const std::string& address, int count, int pushes) {
  const std::string worker = program_path("PUSH_WORKER_BIN");
  std::vector<pid_t> pids;
  for (int p = 0; p < count; ++p) {
    const std::string value = std::to_string(p + 1), n = std::to_string(pushes);
    const Forker forker;
    const pid_t pid = fork();
    if (pid == 0) {
      die_with_parent(forker);
      execl(worker.c_str(), worker.c_str(), "--ps_hosts", address.c_str(), "--pushes", n.c_str(),
            "--value", value.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    if (pid > 0) pids.push_back(pid);
  }
  int ok = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "psd-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log,
                   const std::function<bool()>& prepare) {
  const Forker forker;
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    die_with_parent(forker);
    if (prepare && !prepare()) _exit(99);
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), fileno(stderr));
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

PsdProcess::PsdProcess(std::vector<std::string> extra_args, int port) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "psd-proc-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  log_ = dir_ + "/psd.log";
  const std::string port_file = dir_ + "/port";
  std::vector<std::string> args = {program_path("PSD_BIN"), "--port", std::to_string(port),
                                   "--port_file", port_file};
  args.insert(args.end(), extra_args.begin(), extra_args.end());

  pid_ = spawn_logged(args, log_);
  for (int i = 0; i < 1000; ++i) {  // up to 10 s
    std::ifstream in(port_file);
    if (in >> port_) return;
    if (!alive()) throw std::runtime_error("psd exited during start-up: " + log());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop(1000);
  throw std::runtime_error("psd did not start listening within 10 s: " + log());
}

PsdProcess::~PsdProcess() {
  if (pid_ > 0) stop(5000);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string PsdProcess::log() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool PsdProcess::alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

void PsdProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int PsdProcess::stop(int timeout_ms) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

uint64_t status_bytes(pid_t pid, const char* field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size())) * 1024;
  }
  return 0;
}

}  // namespace ps::test
