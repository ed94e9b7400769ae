// Anonymous memory for the tables' big arrays, in 2 MiB pages where the
// kernel has them (transparent huge pages): rows and index entries are read
// and written at random, and with 4 KiB pages nearly every access costs a
// TLB miss as well as a cache miss.
#pragma once

#include <cstddef>
#include <memory>

namespace ps {

struct Unmap {
  std::size_t bytes = 0;
  void operator()(void* p) const;
};

// At least `bytes` of zeroed memory (whole 4 KiB pages), 2 MiB-aligned and
// advised MADV_HUGEPAGE from 2 MiB up. Throws std::bad_alloc.
std::unique_ptr<std::byte[], Unmap> map_pages(std::size_t bytes);

// `count` Ts in such memory, zeroed; T must be trivially constructible.
template <typename T>
std::unique_ptr<T[], Unmap> map_array_of(std::size_t count) {
  auto bytes = map_pages(count * sizeof(T));
  const Unmap unmap = bytes.get_deleter();
  return std::unique_ptr<T[], Unmap>(reinterpret_cast<T*>(bytes.release()), unmap);
}

}  // namespace ps
