// Memory shared between libpsclient and a psd on the same host, for moving
// tensor values without the two kernel copies of a socket (docs/library.md,
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
// A pid can be reused: the process that connected may be gone, its socket
// held by another, and the pid now a stranger's with a memfd at that fd
// number. So the client also writes a random token at the region's start
// and sends it with attachMemory, and psd maps only a region that holds it
// (only the region's owner can know it); the bytes are the arena's again
// once attached.
//
// Pages are only allocated where written: a large region costs address
// space, and memory only for what transfers have used.
//
//   auto region = SharedRegion::create(256u << 20);          // client
//   auto token = region->stamp_token();
//   ... attachMemory(fd = region->fd(), bytes = region->size(), token) ...
//   auto mapped = SharedRegion::open_peer(pid, fd, limit, token);  // psd
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <sys/types.h>

namespace ps {

class SharedRegion {
 public:
  // A new sealed memfd of `bytes`, mapped here. Throws ps::Error.
  static std::unique_ptr<SharedRegion> create(uint64_t bytes);

  static constexpr std::size_t kTokenBytes = 16;
  using Token = std::array<std::byte, kTokenBytes>;

  // Maps descriptor `fd` of process `pid`. Refused (ps::RequestError, with
  // the reason): a descriptor that cannot be opened, is not an ordinary
  // (tmpfs) memfd sealed with F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL, is
  // larger than `max_bytes`, or does not start with `token`.
  // Contract: the seals are read before the size, so the file can never be
  // shorter than the mapping and no read or write inside [0, size()) can
  // raise SIGBUS, whatever the owner does with its descriptor afterwards.
  static std::unique_ptr<SharedRegion> open_peer(pid_t pid, int fd, uint64_t max_bytes,
                                                 std::span<const std::byte> token);

  // Writes a new random token at the region's start and returns it.
  Token stamp_token();

  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

  // True when [offset, offset + bytes) lies inside the region (no overflow).
  bool contains(uint64_t offset, uint64_t bytes) const {
    return offset <= size_ && bytes <= size_ - offset;
  }

 private:
  SharedRegion(int fd, std::byte* data, uint64_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  std::byte* data_;
  uint64_t size_;
};

}  // namespace ps
