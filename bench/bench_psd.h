// A psd started by a benchmark program: `binary --port 0 --port_file ...
// --log_level warn --max_message_mb 128` plus the caller's flags, in a
// temporary directory of its own. Stopped (SIGTERM) when the object goes,
// and by the kernel if the benchmark dies first (Ctrl-C, an uncaught
// exception), so no daemon is left behind.
//
//   ps::bench::BenchPsd psd("build/server/psd", {"--max_memory_mb", "16384"}, "psd-emb-bench");
//   ps::ClientOptions o; o.ps_hosts = {"127.0.0.1:" + std::to_string(psd.port)};
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ps::bench {

struct BenchPsd {
  pid_t pid = -1;
  int port = 0;
  std::string dir;  // its temporary directory (the port file; a Unix socket may go here)

  // `in_child` runs in the child before exec (CPU affinity, say). Throws if
  // psd has not written its port within 10 s.
  BenchPsd(const std::string& binary, const std::vector<std::string>& flags, const char* tag,
           const std::function<void()>& in_child = {}) {
    dir = std::filesystem::temp_directory_path() /
          (std::string(tag) + "-" + std::to_string(getpid()) + "-" + std::to_string(rand()));
    std::filesystem::create_directories(dir);
    const std::string port_file = dir + "/port";
    const pid_t parent = getpid();
    pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(0);  // died before the line above
      std::vector<std::string> args = {binary,        "--port",           "0",
                                       "--port_file", port_file,          "--log_level",
                                       "warn",        "--max_message_mb", "128"};
      args.insert(args.end(), flags.begin(), flags.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      if (in_child) in_child();
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 1000 && port == 0; ++i) {
      std::ifstream in(port_file);
      if (!(in >> port)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (port == 0) throw std::runtime_error("psd did not start (is --psd right?)");
  }
  ~BenchPsd() {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    std::filesystem::remove_all(dir);
  }
  BenchPsd(const BenchPsd&) = delete;
  BenchPsd& operator=(const BenchPsd&) = delete;
};

}  // namespace ps::bench
