#include "common/auth_token.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <kj/io.h>

#include "ps/errors.h"

namespace ps {

namespace {

constexpr size_t kMaxTokenBytes = 4096;
// Trailing whitespace is trimmed, so a little more than the token may be
// read; no more than this is ever read.
constexpr size_t kMaxFileBytes = 64 << 10;

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string read_auth_token(const std::string& path) {
  auto cannot_read = [&path](int e) {
    return ConfigError("cannot read auth token file " + path + ": " + std::strerror(e));
  };
  auto too_long = [&path] {
    return ConfigError("auth token file " + path + " holds more than " +
                       std::to_string(kMaxTokenBytes) + " bytes");
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer; only regular files are read.
  const kj::AutoCloseFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw cannot_read(errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw cannot_read(errno);
  if (!S_ISREG(st.st_mode)) {
    throw ConfigError("auth token file " + path + " is " + file_kind(st.st_mode) +
                      ", not a file holding the token");
  }
  std::string token(kMaxFileBytes + 1, '\0');
  size_t got = 0;
  try {
    // Up to the whole buffer, or the file's end: one byte past kMaxFileBytes says "too long".
    got = kj::FdInputStream(fd.get()).tryRead(token.data(), token.size(), token.size());
  } catch (const kj::Exception& e) {
    throw ConfigError("cannot read auth token file " + path + ": " + e.getDescription().cStr());
  }
  if (got > kMaxFileBytes) throw too_long();
  token.resize(got);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) throw ConfigError("auth token file " + path + " is empty");
  if (token.size() > kMaxTokenBytes) throw too_long();
  if ((st.st_mode & 077) != 0) {
    // Not fatal (containers often mount secrets 0644), but worth knowing.
    std::fprintf(stderr, "warning: auth token file %s is readable by other users (chmod 600 it)\n",
                 path.c_str());
  }
  return token;
}

}  // namespace ps
