#include "server/process_priority.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ps/errors.h"

namespace ps {

namespace {

std::vector<int> thread_ids() {
  std::vector<int> ids;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return {0};  // no /proc: the calling thread only
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ids.push_back(std::atoi(entry->d_name));
  }
  ::closedir(dir);
  return ids;
}

}  // namespace

void set_process_nice(int nice) {
  if (nice < -20 || nice > 19)
    throw ConfigError("--nice must be in -20..19, not " + std::to_string(nice));
  // Linux keeps a nice value per thread (PRIO_PROCESS with a thread id), so
  // each thread running now is set; the first one tells whether it is
  // allowed at all, before any other is touched.
  for (const int tid : thread_ids()) {
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) == 0) continue;
    if (errno == ESRCH) continue;  // ended meanwhile
    const int error = errno;
    throw ConfigError(
        "--nice " + std::to_string(nice) + ": " + std::strerror(error) +
        (error == EACCES || error == EPERM
             ? " (a value below the current one needs root, CAP_SYS_NICE or a raised RLIMIT_NICE)"
             : ""));
  }
}

}  // namespace ps
