// A caller's array seen as contiguous float32 memory, for pulls to write
// into and pushes to read: anything with the buffer protocol (NumPy arrays,
// memoryview, array.array('f')) or with __dlpack__ (PyTorch CPU tensors; one
// that requires grad is used through .detach(), the same storage). Refused
// with ValueError (wrong dtype, not C-contiguous, read-only for a pull, not
// on the CPU) or TypeError (no array at all) before anything is sent.
//
// Holds the array (and its export) until destroyed, so a buffer lent to an
// async call stays valid; create and destroy it with the GIL held.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

namespace psclient_py {

namespace py = pybind11;

struct DLManagedTensor;

class FloatBuffer {
 public:
  // `what` names the argument in messages, e.g. "pull: out for 'w'".
  static FloatBuffer acquire(py::handle obj, bool writable, const std::string& what);
  FloatBuffer(FloatBuffer&& other) noexcept;
  FloatBuffer& operator=(FloatBuffer&&) = delete;
  FloatBuffer(const FloatBuffer&) = delete;
  ~FloatBuffer();

  std::span<float> span() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  // The array's shape (for messages and new arrays).
  const std::vector<py::ssize_t>& shape() const { return shape_; }

 private:
  FloatBuffer() = default;

  float* data_ = nullptr;
  std::size_t size_ = 0;
  std::vector<py::ssize_t> shape_;
  Py_buffer view_{};
  bool has_view_ = false;
  DLManagedTensor* dl_ = nullptr;
  py::object owner_;  // the array (or its detached view) kept alive
};

}  // namespace psclient_py
