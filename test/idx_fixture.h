// Writes small IDX files (plain or gzipped) into a temporary directory.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <kj/compat/gzip.h>
#include <kj/io.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace ps_test {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/psutil_test_XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    if (!p) std::abort();
    path = p;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

inline void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

inline std::vector<uint8_t> idx_images(uint32_t count, uint32_t rows, uint32_t cols,
                                       const std::vector<uint8_t>& pixels, uint32_t magic = 0x803) {
  std::vector<uint8_t> b;
  put_u32(b, magic);
  put_u32(b, count);
  put_u32(b, rows);
  put_u32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

inline std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 0x801,
                                       int64_t count = -1) {
  std::vector<uint8_t> b;
  put_u32(b, magic);
  put_u32(b, count < 0 ? static_cast<uint32_t>(labels.size()) : static_cast<uint32_t>(count));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

inline std::vector<uint8_t> gzip(const std::vector<uint8_t>& data) {
  kj::VectorOutputStream sink;
  {
    kj::GzipOutputStream gz(sink);
    gz.write(data.data(), data.size());
  }  // destructor finishes the stream
  auto a = sink.getArray();
  return std::vector<uint8_t>(a.begin(), a.end());
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) std::abort();
  kj::FdOutputStream out(fd);
  out.write(data.data(), data.size());
  ::close(fd);
}

// A dataset directory: train (n_train examples) and t10k (n_test), 2x2
// images whose pixels all equal 10*index+label (mod 256) so a gather can be
// checked; labels i % 10. gz: write *.gz files.
inline void write_mnist_dir(const std::string& dir, uint32_t n_train, uint32_t n_test, bool gz) {
  auto make = [&](const std::string& prefix, uint32_t n) {
    std::vector<uint8_t> px, lb;
    for (uint32_t i = 0; i < n; ++i) {
      lb.push_back(static_cast<uint8_t>(i % 10));
      for (int k = 0; k < 4; ++k) px.push_back(static_cast<uint8_t>((10 * i + i % 10) % 256));
    }
    auto im = idx_images(n, 2, 2, px);
    auto la = idx_labels(lb);
    const std::string ext = gz ? ".gz" : "";
    write_file(dir + "/" + prefix + "-images-idx3-ubyte" + ext, gz ? gzip(im) : im);
    write_file(dir + "/" + prefix + "-labels-idx1-ubyte" + ext, gz ? gzip(la) : la);
  };
  make("train", n_train);
  make("t10k", n_test);
}

}  // namespace ps_test
