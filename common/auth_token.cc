#include "common/auth_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ps/errors.h"

namespace ps {

namespace {

constexpr size_t kMaxTokenBytes = 4096;
// Trailing whitespace is trimmed, so a little more than the token may be
// read; a file past this is refused unread.
constexpr off_t kMaxFileBytes = 64 << 10;

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string read_auth_token(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; only regular files
  // are read, and only up to kMaxFileBytes.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw ConfigError("cannot read auth token file " + path + ": " + std::strerror(errno));
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  if (!stated || !S_ISREG(st.st_mode) || st.st_size > kMaxFileBytes) {
    ::close(fd);
    if (!stated)
      throw ConfigError("cannot read auth token file " + path + ": " + std::strerror(stat_errno));
    if (!S_ISREG(st.st_mode))
      throw ConfigError("auth token file " + path + " is " + file_kind(st.st_mode) +
                        ", not a file holding the token");
    throw ConfigError("auth token file " + path + " holds more than " +
                      std::to_string(kMaxTokenBytes) + " bytes");
  }
  std::string token(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = ::read(fd, token.data() + got, token.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw ConfigError("cannot read auth token file " + path + ": " + std::strerror(e));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  token.resize(got);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) throw ConfigError("auth token file " + path + " is empty");
  if (token.size() > kMaxTokenBytes || got > static_cast<size_t>(kMaxFileBytes))
    throw ConfigError("auth token file " + path + " holds more than " +
                      std::to_string(kMaxTokenBytes) + " bytes");
  if ((st.st_mode & 077) != 0) {
    // Not fatal (containers often mount secrets 0644), but worth knowing.
    std::fprintf(stderr, "warning: auth token file %s is readable by other users (chmod 600 it)\n",
                 path.c_str());
  }
  return token;
}

}  // namespace ps
