// IDX reading, plain or gzipped, through KJ streams.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kj/compat/gzip.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "ps/errors.h"
#include "ps/mnist.h"

namespace ps {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // uint8, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // uint8, 1 dimension

std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

// One IDX file opened for sequential reading; gzip detected by magic bytes.
class IdxReader {
 public:
  explicit IdxReader(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
    fd_ = kj::AutoCloseFd(fd);
    struct stat st {};
    if (::fstat(fd, &st) == 0) file_size_ = st.st_size;
    unsigned char head[2] = {0, 0};
    gzipped_ = ::pread(fd, head, 2, 0) == 2 && head[0] == 0x1f && head[1] == 0x8b;
    raw_.emplace(fd);
    if (gzipped_) gzip_.emplace(*raw_);
  }

  bool gzipped() const { return gzipped_; }
  // Bytes on disk (for the plain format: what the header must fit in).
  int64_t file_size() const { return file_size_; }

  // Reads up to n bytes; fewer only at the end of the data.
  size_t read_some(void* buf, size_t n) {
    try {
      kj::InputStream& in = gzipped_ ? static_cast<kj::InputStream&>(*gzip_) : *raw_;
      return in.tryRead(buf, n, n);
    } catch (const kj::Exception& e) {
      throw ConfigError(path_ + ": truncated or corrupt " + (gzipped_ ? "gzip " : "") +
                        "data: " + e.getDescription().cStr());
    }
  }

  uint32_t read_u32(const char* what) {
    unsigned char b[4];
    if (read_some(b, 4) != 4)
      throw ConfigError(path_ + ": truncated: file ends inside the header (" + what + ")");
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
  }

  void check_magic(uint32_t expected, const char* kind) {
    uint32_t m = read_u32("magic number");
    if (m != expected)
      throw ConfigError(
          path_ + ": wrong magic number " + hex(m) + " (expected " + hex(expected) + ", " + kind +
          ")" + ((m == kImagesMagic || m == kLabelsMagic) ? ": images and labels swapped?" : ""));
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  kj::AutoCloseFd fd_;
  int64_t file_size_ = -1;
  bool gzipped_ = false;
  std::optional<kj::FdInputStream> raw_;
  std::optional<kj::GzipInputStream> gzip_;
};

// Deflate expands at most about 1032:1; what a file may hold decides how
// much to reserve before the data is seen.
constexpr int64_t kMaxDeflateRatio = 1032;
int64_t most_bytes_in(const IdxReader& r) {
  if (r.file_size() <= 0) return 0;
  return r.gzipped() ? r.file_size() * kMaxDeflateRatio : r.file_size();
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  IdxReader r(path);
  r.check_magic(kImagesMagic, "IDX3 uint8 images");
  const uint32_t count = r.read_u32("image count");
  const uint32_t rows = r.read_u32("rows");
  const uint32_t cols = r.read_u32("cols");
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096)
    throw ConfigError(path + ": implausible image size " + std::to_string(rows) + "x" +
                      std::to_string(cols));
  const int64_t dim = int64_t(rows) * cols;
  const int64_t bytes = int64_t(count) * dim;
  if (!r.gzipped() && r.file_size() >= 0 && r.file_size() < 16 + bytes)
    throw ConfigError(path + ": truncated: header says " + std::to_string(count) + " images of " +
                      std::to_string(rows) + "x" + std::to_string(cols) + " (" +
                      std::to_string(16 + bytes) + " bytes) but the file has " +
                      std::to_string(r.file_size()) + " bytes");
  IdxImages out;
  out.count = count;
  out.rows = static_cast<int>(rows);
  out.cols = static_cast<int>(cols);
  // A plain file was checked against its size; gzip cannot hold more than
  // kMaxDeflateRatio times its own size (a 32-byte file declaring 2^32
  // images reserved 1 GiB), and the rest grows as the data really arrives.
  out.pixels.reserve(static_cast<size_t>(std::min(bytes, most_bytes_in(r))));
  std::vector<unsigned char> chunk(1 << 16);
  int64_t done = 0;
  while (done < bytes) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(bytes - done, chunk.size()));
    const size_t got = r.read_some(chunk.data(), want);
    const size_t old = out.pixels.size();
    out.pixels.resize(old + got);
    float* dst = out.pixels.data() + old;
    for (size_t i = 0; i < got; ++i) dst[i] = chunk[i] * (1.0f / 255.0f);
    done += static_cast<int64_t>(got);
    if (got < want)
      throw ConfigError(path + ": truncated: header says " + std::to_string(count) +
                        " images but the data ends after " + std::to_string(done / dim) +
                        " of them");
  }
  return out;
}

std::vector<int32_t> read_idx_labels(const std::string& path, int num_classes) {
  IdxReader r(path);
  r.check_magic(kLabelsMagic, "IDX1 uint8 labels");
  const uint32_t count = r.read_u32("label count");
  if (!r.gzipped() && r.file_size() >= 0 && r.file_size() < 8 + int64_t(count))
    throw ConfigError(path + ": truncated: header says " + std::to_string(count) +
                      " labels but the file has " + std::to_string(r.file_size()) + " bytes");
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(std::min<int64_t>(count, most_bytes_in(r))));
  std::vector<unsigned char> chunk(1 << 16);
  while (out.size() < count) {
    const size_t want = std::min<size_t>(count - out.size(), chunk.size());
    const size_t got = r.read_some(chunk.data(), want);
    for (size_t i = 0; i < got; ++i) {
      if (chunk[i] >= num_classes)
        throw ConfigError(path + ": label " + std::to_string(chunk[i]) + " at index " +
                          std::to_string(out.size()) + " out of range 0.." +
                          std::to_string(num_classes - 1));
      out.push_back(chunk[i]);
    }
    if (got < want)
      throw ConfigError(path + ": truncated: header says " + std::to_string(count) +
                        " labels but the data ends after " + std::to_string(out.size()));
  }
  return out;
}

}  // namespace ps
