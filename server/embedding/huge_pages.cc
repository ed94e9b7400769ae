#include "server/embedding/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>

namespace ps {

void Unmap::operator()(void* p) const {
  if (p != nullptr) munmap(p, bytes);
}

std::unique_ptr<std::byte[], Unmap> map_pages(std::size_t bytes) {
  constexpr std::size_t kPage = 4096, kHugePage = 2u << 20;
  bytes = (std::max<std::size_t>(1, bytes) + kPage - 1) / kPage * kPage;
  if (bytes < kHugePage) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return {static_cast<std::byte*>(p), Unmap{bytes}};
  }
  // Huge pages need 2 MiB-aligned ranges: map a page more and give back the ends.
  void* p =
      mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto raw = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = (raw + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  if (start > raw) munmap(p, start - raw);
  const uintptr_t end = raw + bytes + kHugePage, used = start + bytes;
  if (end > used) munmap(reinterpret_cast<void*>(used), end - used);
  // Before the first touch, so the pages come as huge ones (advice only: ignored without THP).
  madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);
  return {reinterpret_cast<std::byte*>(start), Unmap{bytes}};
}

}  // namespace ps
