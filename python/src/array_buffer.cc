#include "python/src/array_buffer.h"

#include <algorithm>

#include <cstdint>
#include <cstring>
#include <utility>

namespace psclient_py {

// DLPack's ABI (dlpack.h, v0.x as PyTorch 1.13 exports it): a capsule named
// "dltensor" holding a DLManagedTensor, renamed "used_dltensor" once taken;
// the taker calls its deleter when done.
struct DLDevice {
  int32_t device_type;  // 1: CPU, 3: CUDA host (pinned) memory
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 2: float
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

namespace {

constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDAHost = 3;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4;

std::string dtype_name(const DLDataType& t) {
  const char* base = t.code == kDLInt      ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLFloat  ? "float"
                     : t.code == kDLBfloat ? "bfloat"
                                           : "code";
  return std::string(base) + std::to_string(t.bits) +
         (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

// The buffer protocol's format of one element, without a native or
// little-endian byte-order prefix (this library runs on little-endian
// hosts); "" for a big-endian or missing format.
std::string plain_format(const char* format) {
  if (format == nullptr) return "B";  // unsigned bytes
  if (format[0] == '<' || format[0] == '=' || format[0] == '@') ++format;
  if (format[0] == '>' || format[0] == '!') return "";
  return format;
}

// A float32 element; for ids, an 8-byte integer (q/l signed, Q/L unsigned;
// 'l' is 8 bytes on LP64 hosts, which itemsize checks).
bool element_ok(const Py_buffer& view, bool ids, bool* is_unsigned) {
  const std::string f = plain_format(view.format);
  if (!ids) return view.itemsize == 4 && f == "f";
  *is_unsigned = f == "Q" || f == "L";
  return view.itemsize == 8 && (f == "q" || f == "l" || *is_unsigned);
}

// The dtype as the caller knows it: NumPy's name when there is one.
std::string describe_dtype(py::handle obj, const Py_buffer& view) {
  if (py::hasattr(obj, "dtype")) return py::str(obj.attr("dtype"));
  return std::string("format '") + (view.format ? view.format : "B") + "' of " +
         std::to_string(view.itemsize) + " bytes";
}

}  // namespace

ArrayBuffer ArrayBuffer::floats(py::handle obj, bool writable, const std::string& what) {
  return acquire(obj, writable, what, Element::kFloat32);
}

ArrayBuffer ArrayBuffer::ids(py::handle obj, const std::string& what) {
  return acquire(obj, false, what, Element::kId64);
}

ArrayBuffer ArrayBuffer::acquire(py::handle obj, bool writable, const std::string& what,
                                 Element element) {
  const bool ids = element == Element::kId64;
  const char* want = ids ? "int64 or uint64" : "float32";
  ArrayBuffer b;
  if (PyObject_CheckBuffer(obj.ptr())) {
    const int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &b.view_, flags) != 0) {
      // The exporter refused: read-only for a pull, or a layout it cannot describe.
      py::error_already_set refused;
      const bool read_only =
          writable && PyObject_GetBuffer(obj.ptr(), &b.view_, PyBUF_STRIDES | PyBUF_FORMAT) == 0;
      if (read_only) {
        PyBuffer_Release(&b.view_);
        throw py::value_error(what + " is read-only: a pull writes into it");
      }
      PyErr_Clear();
      throw py::value_error(
          what + " cannot be read as an array: " + std::string(py::str(refused.value())));
    }
    b.has_view_ = true;
    b.owner_ = py::reinterpret_borrow<py::object>(obj);
    if (!element_ok(b.view_, ids, &b.unsigned_)) {
      throw py::value_error(what + " must be " + want + ", got " + describe_dtype(obj, b.view_));
    }
    if (!PyBuffer_IsContiguous(&b.view_, 'C')) {
      throw py::value_error(what +
                            " must be C-contiguous (use numpy.ascontiguousarray or .contiguous())");
    }
    b.data_ = b.view_.buf;
    b.size_ = static_cast<std::size_t>(b.view_.len / b.view_.itemsize);
    b.bytes_ = static_cast<std::size_t>(b.view_.len);
    b.shape_.assign(b.view_.shape, b.view_.shape + b.view_.ndim);
    return b;
  }
  if (!py::hasattr(obj, "__dlpack__")) {
    throw py::type_error(
        what + " must be " + (ids ? "an int64 or uint64" : "a float32") +
        " array (NumPy array, PyTorch CPU tensor, or any object with the buffer protocol or "
        "__dlpack__), got " +
        std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  // A tensor that requires grad (a module's parameter) will not export
  // itself; its detached view shares the storage, which is what we write.
  py::object source = py::reinterpret_borrow<py::object>(obj);
  if (py::hasattr(obj, "requires_grad") && py::hasattr(obj, "detach") &&
      obj.attr("requires_grad").cast<bool>()) {
    source = obj.attr("detach")();
  }
  // A lazily negated or conjugated view (x.conj().imag is one) holds the
  // negated values in memory, and DLPack v0.x exports that memory without
  // saying so: a push would send, and a pull would write, the wrong sign.
  for (const char* lazy : {"is_neg", "is_conj"}) {
    if (py::hasattr(source, lazy) && source.attr(lazy)().cast<bool>()) {
      throw py::value_error(what + " is a lazily " +
                            (lazy[3] == 'n' ? "negated" : "conjugated") + " torch view (" + lazy +
                            "() is True): its memory holds other values than it shows; pass " +
                            (lazy[3] == 'n' ? ".resolve_neg()" : ".resolve_conj()") +
                            " (a copy), or a plain tensor for a pull");
    }
  }
  if (py::hasattr(source, "device") && py::hasattr(source.attr("device"), "type")) {
    const std::string device = py::str(source.attr("device").attr("type"));
    if (device != "cpu")
      throw py::value_error(what + " must be in CPU memory, got a tensor on " + device);
  }
  py::object capsule;
  try {
    capsule = source.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    // The exporter refused: a dtype or layout DLPack cannot describe.
    if (!e.matches(PyExc_RuntimeError) && !e.matches(PyExc_TypeError) &&
        !e.matches(PyExc_BufferError))
      throw;
    throw py::value_error(what + " cannot be read as an array: " + std::string(py::str(e.value())));
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  // Ours now: the capsule no longer frees it; ~ArrayBuffer calls the deleter.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  b.dl_ = managed;
  b.owner_ = source;
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
    throw py::value_error(what + " must be in CPU memory (DLPack device type " +
                          std::to_string(t.device.device_type) + ")");
  }
  const bool dtype_ok =
      t.dtype.lanes == 1 &&
      (ids ? (t.dtype.code == kDLInt || t.dtype.code == kDLUInt) && t.dtype.bits == 64
           : t.dtype.code == kDLFloat && t.dtype.bits == 32);
  if (!dtype_ok) throw py::value_error(what + " must be " + want + ", got " + dtype_name(t.dtype));
  b.unsigned_ = t.dtype.code == kDLUInt;
  uint64_t count = 1;
  int64_t expected_stride = 1;
  bool contiguous = true;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.strides != nullptr && t.shape[d] != 1 && t.strides[d] != expected_stride)
      contiguous = false;
    expected_stride *= t.shape[d];
    count *= static_cast<uint64_t>(t.shape[d]);
  }
  // An array of no elements has nothing out of place, whatever strides it reports.
  if (!contiguous && count != 0)
    throw py::value_error(what + " must be C-contiguous (use .contiguous())");
  b.data_ = static_cast<char*>(t.data) + t.byte_offset;
  b.size_ = count;
  b.bytes_ = count * (t.dtype.bits / 8);
  b.shape_.assign(t.shape, t.shape + t.ndim);
  return b;
}

bool ArrayBuffer::overlaps(const ArrayBuffer& other) const {
  if (bytes_ == 0 || other.bytes_ == 0) return false;
  const auto a = reinterpret_cast<uintptr_t>(data_), b = reinterpret_cast<uintptr_t>(other.data_);
  return a < b + other.bytes_ && b < a + bytes_;
}

std::optional<std::pair<std::size_t, std::size_t>> ArrayBuffer::first_overlap(
    const std::vector<const ArrayBuffer*>& buffers) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i]->bytes_ != 0) order.push_back(i);
  const auto start = [&](std::size_t i) { return reinterpret_cast<uintptr_t>(buffers[i]->data_); };
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return start(a) < start(b); });
  // Sorted by start: one overlaps another iff it starts before the furthest end so far.
  std::size_t furthest = 0;
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::size_t f = order[furthest];
    if (start(order[k]) < start(f) + buffers[f]->bytes_) return std::pair{f, order[k]};
    if (start(order[k]) + buffers[order[k]]->bytes_ > start(f) + buffers[f]->bytes_) furthest = k;
  }
  return std::nullopt;
}

ArrayBuffer::ArrayBuffer(ArrayBuffer&& other) noexcept
    : data_(other.data_),
      size_(other.size_),
      bytes_(other.bytes_),
      unsigned_(other.unsigned_),
      shape_(std::move(other.shape_)),
      view_(other.view_),
      has_view_(std::exchange(other.has_view_, false)),
      dl_(std::exchange(other.dl_, nullptr)),
      owner_(std::move(other.owner_)) {}

ArrayBuffer::~ArrayBuffer() {
  if (has_view_) PyBuffer_Release(&view_);
  if (dl_ != nullptr && dl_->deleter != nullptr) dl_->deleter(dl_);
}

}  // namespace psclient_py
