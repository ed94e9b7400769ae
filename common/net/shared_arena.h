// libpsclient's side of a shared memory region (common/net/shared_region.h):
// hands out blocks of it to requests in flight, one block per tensor part.
//
// A block goes back to the arena once psd has answered the request that
// named it; a request given up before its answer (a timeout) leaves its
// block out of use for good, since psd may still read or write it. The
// arena dies with its connection, so that loss is bounded by one
// connection's life.
//
// First fit from the low end: the pages in use stay few and warm (a first
// touch of a page is a page fault), so a region far larger than
// any transfer costs only address space. No block: the caller sends that
// part over the socket instead.
//
// Single-threaded: lives on the client's event loop with its connection.
//
//   auto arena = std::make_shared<SharedArena>(SharedRegion::create(256u << 20), region_id);
//   auto blocks = kj::heap<SharedBlocks>(arena);
//   if (auto off = blocks->take(bytes)) std::memcpy(arena->at(*off), src, bytes);
//   ... send, then blocks->answered() when psd's reply (or error) is in ...
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/net/shared_region.h"

namespace ps {

class SharedArena {
 public:
  // Blocks start at multiples of this (a cache line).
  static constexpr uint64_t kAlign = 64;

  SharedArena(std::shared_ptr<SharedRegion> region, uint32_t id);

  uint32_t id() const { return id_; }
  const SharedRegion& region() const { return *region_; }
  std::byte* at(uint64_t offset) const { return region_->data() + offset; }

  // Offset of a free block of at least `bytes`, or none.
  std::optional<uint64_t> allocate(uint64_t bytes);
  void release(uint64_t offset);

  uint64_t bytes_in_use() const { return in_use_; }
  uint64_t bytes_lost() const { return lost_; }
  void note_lost(uint64_t bytes) { lost_ += bytes; }

 private:
  std::shared_ptr<SharedRegion> region_;
  uint32_t id_;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> bytes
  uint64_t in_use_ = 0;
  uint64_t lost_ = 0;
};

// The blocks of one request: released when this is destroyed after
// answered(), kept out of use if destroyed before.
class SharedBlocks {
 public:
  explicit SharedBlocks(std::shared_ptr<SharedArena> arena) : arena_(std::move(arena)) {}
  ~SharedBlocks();
  SharedBlocks(const SharedBlocks&) = delete;
  SharedBlocks& operator=(const SharedBlocks&) = delete;

  std::optional<uint64_t> take(uint64_t bytes);
  void answered() { answered_ = true; }
  SharedArena& arena() const { return *arena_; }
  bool empty() const { return taken_.empty(); }

 private:
  std::shared_ptr<SharedArena> arena_;
  std::vector<std::pair<uint64_t, uint64_t>> taken_;  // offset, bytes
  bool answered_ = false;
};

}  // namespace ps
