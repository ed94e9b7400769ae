// A caller's array seen as contiguous memory of one element type: float32
// values for pulls to write into and pushes to read, or 64-bit row ids
// (int64 or uint64) for embedding tables. Anything with the buffer protocol
// (NumPy arrays, memoryview, array.array) or with __dlpack__ (PyTorch CPU
// tensors; one that requires grad is used through .detach(), the same
// storage). Refused with ValueError (wrong dtype, not C-contiguous,
// read-only for a pull, not on the CPU, a torch view whose is_neg() or
// is_conj() is set) or TypeError (no array at all)
// before anything is sent.
//
// Holds the array (and its export) until destroyed, so a buffer lent to an
// async call stays valid; create and destroy it with the GIL held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

namespace psclient_py {

namespace py = pybind11;

struct DLManagedTensor;

class ArrayBuffer {
 public:
  // `what` names the argument in messages, e.g. "pull: out for 'w'".
  static ArrayBuffer floats(py::handle obj, bool writable, const std::string& what);
  // Row ids: int64 or uint64 (a uint64 id is passed on as the same 64 bits).
  static ArrayBuffer ids(py::handle obj, const std::string& what);
  ArrayBuffer(ArrayBuffer&& other) noexcept;
  ArrayBuffer& operator=(ArrayBuffer&&) = delete;
  ArrayBuffer(const ArrayBuffer&) = delete;
  ~ArrayBuffer();

  // float32 buffers (floats()).
  std::span<float> span() const { return {static_cast<float*>(data_), size_}; }
  // id buffers (ids()).
  std::span<const int64_t> id_span() const { return {static_cast<const int64_t*>(data_), size_}; }
  bool unsigned_ids() const { return unsigned_; }
  std::size_t size() const { return size_; }  // elements
  // Whether the two share any byte of memory.
  bool overlaps(const ArrayBuffer& other) const;
  // Two of `buffers` (their indices) that share memory, if any; n log n.
  static std::optional<std::pair<std::size_t, std::size_t>> first_overlap(
      const std::vector<const ArrayBuffer*>& buffers);
  // The array's shape (for messages and new arrays).
  const std::vector<py::ssize_t>& shape() const { return shape_; }

 private:
  enum class Element { kFloat32, kId64 };
  static ArrayBuffer acquire(py::handle obj, bool writable, const std::string& what,
                             Element element);
  ArrayBuffer() = default;

  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t bytes_ = 0;
  bool unsigned_ = false;
  std::vector<py::ssize_t> shape_;
  Py_buffer view_{};
  bool has_view_ = false;
  DLManagedTensor* dl_ = nullptr;
  py::object owner_;  // the array (or its detached view) kept alive
};

}  // namespace psclient_py
