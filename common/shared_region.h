// Memory shared between libpsclient and a psd on the same host, for moving
// tensor values without the two kernel copies of a socket (README,
// "Same host").
//
// The client makes the region: an anonymous memfd, sized once and sealed
// against shrinking, so nothing the client does later can leave psd
// touching memory that is gone (a shrunk file would kill psd with SIGBUS).
// psd opens the client's descriptor through /proc/<client pid>/fd/<fd>,
// with the pid the kernel gives for the Unix-socket peer (SO_PEERCRED):
// it maps only a region of a process that is connected to it, and only if
// the kernel lets it open that process's descriptors (same user). The file
// has no name, so nothing is left behind however either side ends.
//
// Pages are only allocated where written: a large region costs address
// space, and memory only for what transfers have used.
//
//   auto region = SharedRegion::create(256u << 20);          // client
//   ... attachMemory(fd = region->fd(), bytes = region->size()) ...
//   auto mapped = SharedRegion::open_peer(pid, fd, limit);    // psd
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <sys/types.h>

namespace ps {

class SharedRegion {
 public:
  // A new sealed memfd of `bytes`, mapped here. Throws ps::Error.
  static std::unique_ptr<SharedRegion> create(uint64_t bytes);

  // Maps descriptor `fd` of process `pid`. Refused (ps::RequestError, with
  // the reason): a descriptor that cannot be opened, is not a memfd sealed
  // against shrinking, or is larger than `max_bytes`.
  static std::unique_ptr<SharedRegion> open_peer(pid_t pid, int fd, uint64_t max_bytes);

  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

  // True when [offset, offset + bytes) lies inside the region (no overflow).
  bool contains(uint64_t offset, uint64_t bytes) const { return offset <= size_ && bytes <= size_ - offset; }

 private:
  SharedRegion(int fd, std::byte* data, uint64_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  std::byte* data_;
  uint64_t size_;
};

}  // namespace ps
