#include "common/net/shared_region.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "ps/errors.h"

namespace ps {

namespace {

std::string os_error(const std::string& what) { return what + ": " + std::strerror(errno); }

std::byte* map(int fd, uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

}  // namespace

std::unique_ptr<SharedRegion> SharedRegion::create(uint64_t bytes) {
  if (bytes == 0) throw ConfigError("shared memory region of 0 bytes");
  const int fd = ::memfd_create("psclient", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw Error(os_error("memfd_create"));
  // No F_SEAL_WRITE: both sides write. No F_SEAL_GROW needed for safety,
  // but a fixed size is what psd maps.
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const std::string msg = os_error("shared memory region");
    ::close(fd);
    throw Error(msg);
  }
  std::byte* data = map(fd, bytes);
  if (data == nullptr) {
    const std::string msg = os_error("mmap of shared memory region");
    ::close(fd);
    throw Error(msg);
  }
  return std::unique_ptr<SharedRegion>(new SharedRegion(fd, data, bytes));
}

SharedRegion::Token SharedRegion::stamp_token() {
  Token token;
  std::random_device random;  // the kernel's entropy: not guessable by another process
  for (std::size_t i = 0; i < token.size(); i += sizeof(unsigned)) {
    const unsigned r = random();
    std::memcpy(token.data() + i, &r, std::min(sizeof(unsigned), token.size() - i));
  }
  std::memcpy(data_, token.data(), std::min<uint64_t>(token.size(), size_));
  return token;
}

std::unique_ptr<SharedRegion> SharedRegion::open_peer(pid_t pid, int peer_fd, uint64_t max_bytes,
                                                      std::span<const std::byte> token) {
  if (pid <= 0 || peer_fd < 0) throw RequestError("attachMemory: no such descriptor");
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(peer_fd);
  // Only a file is opened, and never so that opening has an effect: a
  // terminal would become psd's controlling one (its hangup ends psd), a
  // device could block the event loop.
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0)
    throw RequestError("attachMemory: " + os_error("cannot open " + path));
  if (!S_ISREG(target.st_mode)) throw RequestError("attachMemory: descriptor is not a memory file");
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) throw RequestError("attachMemory: " + os_error("cannot open " + path));
  auto refuse = [fd](const std::string& why) {
    ::close(fd);
    return RequestError("attachMemory: " + why);
  };
  // Seals before size: once F_SEAL_SHRINK is on, the size taken after it
  // can never shrink under psd's mapping, so no access inside [0, size)
  // can fault (SIGBUS). Taken the other way round, a client can shrink and
  // seal the file between the two calls.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  constexpr int kRequired = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (seals < 0 || (seals & kRequired) != kRequired) {
    throw refuse("region must be a memfd sealed with F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL");
  }
  // A hugetlbfs memfd can fault when the huge page pool runs dry: only
  // ordinary shared memory (tmpfs) is mapped.
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    throw refuse("region must be an ordinary memfd (not hugetlbfs)");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw refuse("descriptor is not a memory file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0 || size > max_bytes) {
    throw refuse("region of " + std::to_string(size) + " bytes (psd maps 1 to " +
                 std::to_string(max_bytes) + ", --max_shared_memory_mb)");
  }
  if (token.size() != kTokenBytes) {
    throw refuse("a token of " + std::to_string(kTokenBytes) + " bytes must come with the region");
  }
  if (size < kTokenBytes)
    throw refuse("region of " + std::to_string(size) + " bytes, smaller than its token");
  std::byte* data = map(fd, size);
  if (data == nullptr) throw refuse(os_error("mmap"));
  auto region = std::unique_ptr<SharedRegion>(new SharedRegion(fd, data, size));
  if (std::memcmp(region->data(), token.data(), kTokenBytes) != 0) {
    throw RequestError(
        "attachMemory: the region does not hold the token sent with it: not the caller's memory "
        "(its pid reused by another process?)");
  }
  return region;
}

SharedRegion::~SharedRegion() {
  ::munmap(data_, size_);
  ::close(fd_);
}

}  // namespace ps
