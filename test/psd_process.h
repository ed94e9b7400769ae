// Starts a real psd process on a free loopback port for integration tests,
// and stops it (by PID, SIGTERM then SIGKILL) when it goes out of scope.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ps::test {

class PsdProcess {
 public:
  // Waits (bounded) until psd listens; throws std::runtime_error otherwise.
  // port 0: a free port; otherwise that port (a restart on the same address).
  explicit PsdProcess(std::vector<std::string> extra_args = {}, int port = 0);
  ~PsdProcess();
  PsdProcess(const PsdProcess&) = delete;
  PsdProcess& operator=(const PsdProcess&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  std::string log() const;

  bool alive();
  // SIGTERM, then wait up to `timeout_ms`; returns the exit status (or -1 if
  // it had to be killed).
  int stop(int timeout_ms = 10000);
  // SIGKILL (a crash: no checkpoint, no goodbye), and reap it.
  void kill();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
  std::string log_;
};

// A directory removed with its contents at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Starts args[0] with args, stdout and stderr into `log`; returns its PID.
// Started from the main thread, the child is killed if the test process
// dies first (PR_SET_PDEATHSIG), so a crashed test leaves no psd behind.
// `prepare`, if given, runs in the child first (limits, capabilities); if
// it returns false the child exits 99 without starting the program.
pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log,
                   const std::function<bool()>& prepare = {});

// Runs `count` push_worker processes (PUSH_WORKER_BIN) against `address`
// at once, worker p pushing `pushes` gradients of value p + 1 to its
// 4096-float tensor "shared"; returns how many exited with status 0.
int run_push_workers(const std::string& address, int count, int pushes);

// A byte count from /proc/<pid>/status (a "kB" field such as "VmRSS" or
// "VmHWM"); 0 if there is none.
uint64_t status_bytes(pid_t pid, const char* field);

// Path of a program built next to the tests (from the environment variable
// the meson test sets, e.g. PSD_BIN).
std::string program_path(const char* env_var);

}  // namespace ps::test
