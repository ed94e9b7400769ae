// IDX reading: plain and gzipped files written here, and every bad-file case.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include <catch2/catch.hpp>

#include "test/idx_fixture.h"
#include "ps/errors.h"
#include "ps/mnist.h"

using namespace ps_test;

#define CHECK_CONFIG_ERROR(expr, text)              \
  do {                                              \
    CHECK_THROWS_AS(expr, ps::ConfigError);         \
    CHECK_THROWS_WITH(expr, Catch::Contains(text)); \
  } while (0)

namespace {
const std::vector<uint8_t> kPixels = {0, 255, 51, 102, 1, 2, 3, 4, 5, 6, 7, 8};  // 2 images 2x3
}

TEST_CASE("IDX images and labels, plain and gzipped") {
  TempDir t;
  for (bool gz : {false, true}) {
    INFO("gzip " << gz);
    auto im = idx_images(2, 2, 3, kPixels);
    auto lb = idx_labels({7, 0});
    write_file(t / "im", gz ? gzip(im) : im);
    write_file(t / "lb", gz ? gzip(lb) : lb);
    auto images = ps::read_idx_images(t / "im");
    CHECK(images.count == 2);
    CHECK(images.rows == 2);
    CHECK(images.cols == 3);
    REQUIRE(images.pixels.size() == 12);
    for (size_t i = 0; i < 12; ++i) CHECK(images.pixels[i] == Approx(kPixels[i] / 255.0f));
    CHECK(images.pixels[1] == 1.0f);
    CHECK(ps::read_idx_labels(t / "lb") == std::vector<int32_t>{7, 0});
  }
}

TEST_CASE("IDX: bad files") {
  TempDir t;
  auto im = idx_images(2, 2, 3, kPixels);
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "nope"), "cannot open");

  // Truncated: plain (checked against the file size) and gzipped (data ends).
  std::vector<uint8_t> cut(im.begin(), im.end() - 1);
  write_file(t / "cut", cut);
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "cut"), "truncated: header says 2 images of 2x3");
  write_file(t / "cut.gz", gzip(cut));
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "cut.gz"), "data ends after 1 of them");
  write_file(t / "hdr", std::vector<uint8_t>(im.begin(), im.begin() + 10));
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "hdr"), "file ends inside the header");
  // A gzip stream cut short, and garbage behind gzip's magic bytes.
  auto gz = gzip(im);
  write_file(t / "gzcut", std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "gzcut"), "truncated or corrupt gzip");
  write_file(t / "gzbad", {0x1f, 0x8b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "gzbad"), "corrupt gzip");

  // Wrong magic: a label file read as images and the other way round.
  auto lb = idx_labels({1, 2});
  write_file(t / "lb", lb);
  write_file(t / "im", im);
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "lb"),
                     "wrong magic number 0x00000801 (expected 0x00000803");
  CHECK_CONFIG_ERROR(ps::read_idx_labels(t / "im"), "swapped?");
  write_file(t / "png", idx_images(2, 2, 3, kPixels, 0x89504e47));
  CHECK_CONFIG_ERROR(ps::read_idx_images(t / "png"), "wrong magic number 0x89504e47");

  // Labels out of range; fewer labels than the header says.
  write_file(t / "lb10", idx_labels({3, 10, 2}));
  CHECK_CONFIG_ERROR(ps::read_idx_labels(t / "lb10"), "label 10 at index 1 out of range 0..9");
  write_file(t / "lbcut", idx_labels({1, 2}, 0x801, 3));
  CHECK_CONFIG_ERROR(ps::read_idx_labels(t / "lbcut"), "truncated: header says 3 labels");
  write_file(t / "lbcut.gz", gzip(idx_labels({1, 2}, 0x801, 3)));
  CHECK_CONFIG_ERROR(ps::read_idx_labels(t / "lbcut.gz"), "data ends after 2");
}

TEST_CASE(
    "IDX: a tiny gzip file that declares a huge data set fails without reserving room for it") {
  TempDir t;
  write_file(t / "huge.gz", gzip(idx_images(0xFFFFFFFF, 4096, 4096, {1, 2, 3})));
  write_file(t / "huge-labels.gz", gzip(idx_labels({1}, 0x801, 0xFFFFFFFF)));
  // In a child with 128 MiB of address space to spare: a reserve sized by
  // the header (1 GiB of pixels, 256 MiB of labels before) fails there with
  // std::bad_alloc instead of the clear error.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = static_cast<rlim_t>(pages) * ::sysconf(_SC_PAGESIZE) + (128u << 20);
    const rlimit rl{limit, limit};
    if (::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(64);
    // 0: refused as truncated; 1: read; 2: another error; 4: anything else.
    auto refusal = [](const auto& read, const char* text) {
      try {
        read();
        return 1;
      } catch (const ps::ConfigError& e) {
        return std::strstr(e.what(), text) == nullptr ? 2 : 0;
      } catch (...) {
        return 4;
      }
    };
    ::_exit(refusal([&] { ps::read_idx_images(t / "huge.gz"); }, "data ends after 0 of them") |
            refusal([&] { ps::read_idx_labels(t / "huge-labels.gz"); }, "data ends after 1") << 3);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // 4 / 32: out of memory (bad_alloc)
}

TEST_CASE("MnistData::load: plain and gz, validation split") {
  for (bool gz : {false, true}) {
    TempDir t;
    write_mnist_dir(t.path, 30, 7, gz);
    auto d = ps::MnistData::load(t.path, 5);
    CHECK(d.rows == 2);
    CHECK(d.cols == 2);
    CHECK(d.train.size == 25);
    CHECK(d.train.dim == 4);
    CHECK(d.validation.size == 5);
    CHECK(d.test.size == 7);
    CHECK(d.train.images.size() == 25 * 4);
    // The validation set is the tail of the training files.
    CHECK(d.validation.labels[0] == 25 % 10);
    CHECK(d.validation.image(0)[3] == Approx((10 * 25 + 5) / 255.0f));
    CHECK(d.test.labels[6] == 6);
    CHECK(ps::MnistData::load(t.path, 0).validation.size == 0);
  }
}

TEST_CASE("MnistData::load: bad directories") {
  TempDir t;
  CHECK_CONFIG_ERROR(ps::MnistData::load(t.path), "looked for " + t.path +
                                                      "/train-images-idx3-ubyte[.gz], " + t.path +
                                                      "/train-labels-idx1-ubyte[.gz], " + t.path +
                                                      "/t10k-images-idx3-ubyte[.gz], " + t.path +
                                                      "/t10k-labels-idx1-ubyte[.gz]");
  write_mnist_dir(t.path, 30, 7, false);
  CHECK_CONFIG_ERROR(ps::MnistData::load(t.path, 30), "validation size 30 must be in 0..29");
  CHECK_CONFIG_ERROR(ps::MnistData::load(t.path, -1), "validation size -1");
  ::unlink((t / "t10k-labels-idx1-ubyte").c_str());
  CHECK_CONFIG_ERROR(ps::MnistData::load(t.path),
                     "looked for " + t.path + "/t10k-labels-idx1-ubyte[.gz] (");
  // Count mismatch between images and labels.
  write_file(t / "t10k-labels-idx1-ubyte", idx_labels({1, 2, 3}));
  CHECK_CONFIG_ERROR(ps::MnistData::load(t.path),
                     "count mismatch: " + t.path + "/t10k-images-idx3-ubyte has 7 images but " +
                         t.path + "/t10k-labels-idx1-ubyte has 3 labels");
  // A test set without images: an accuracy of 0 would pass for a result.
  write_file(t / "t10k-labels-idx1-ubyte", idx_labels({}));
  write_file(t / "t10k-images-idx3-ubyte", idx_images(0, 2, 2, {}));
  CHECK_CONFIG_ERROR(ps::MnistData::load(t.path), "t10k-images-idx3-ubyte holds no images");
  // Image size mismatch between train and test.
  write_file(t / "t10k-labels-idx1-ubyte", idx_labels({1}));
  write_file(t / "t10k-images-idx3-ubyte", idx_images(1, 1, 4, {1, 2, 3, 4}));
  CHECK_CONFIG_ERROR(ps::MnistData::load(t.path), "image size mismatch");
}

TEST_CASE("Fashion-MNIST from Debian's dataset-fashion-mnist, if installed") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    WARN("skipped: " << dir << " not present (apt-get install dataset-fashion-mnist)");
    return;
  }
  auto d = ps::MnistData::load(dir);
  CHECK(d.rows == 28);
  CHECK(d.cols == 28);
  CHECK(d.train.size == 55000);
  CHECK(d.validation.size == 5000);
  CHECK(d.test.size == 10000);
  float lo = 1, hi = 0;
  for (float v : d.test.images) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
  std::vector<int> per_class(10);
  for (int32_t l : d.test.labels) ++per_class[l];
  CHECK(per_class == std::vector<int>(10, 1000));  // Fashion-MNIST's test set is balanced
}
