// Memory for the rows of pullRows replies, reused from one reply to the
// next. psd gathers a pull's rows into such a buffer and sends them from
// there without a copy (the reply references it; the connection's stream
// holds it until written). Fresh memory of a megabyte or more costs a page
// fault per 4 KiB and a zero-filled page each time, as much as the gather
// itself; a reused buffer costs neither.
//
// Buffers come back when the last holder lets go (from any thread). Up to
// `max_spare_bytes` of them are kept for reuse; more are freed.
//
//   RowBuffers pool(4 << 20);
//   std::shared_ptr<float> rows = pool.take(n);   // n floats, not initialised
//   ... fill, send, drop: back to the pool
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace ps {

class RowBuffers {
 public:
  explicit RowBuffers(std::size_t max_spare_bytes);

  // `floats` floats (at least one), uninitialised, 64-byte aligned.
  std::shared_ptr<float> take(std::size_t floats);

  std::size_t spare_bytes() const;  // kept for reuse now (for tests)

  // psd's pool, for every connection.
  static RowBuffers& process();

 private:
  struct Spare {
    float* data;
    std::size_t floats;
  };
  struct State {
    explicit State(std::size_t max) : max_spare_bytes(max) {}
    ~State();
    void give_back(float* data, std::size_t floats);
    std::mutex mutex;
    std::vector<Spare> spare;
    std::size_t spare_bytes = 0;
    const std::size_t max_spare_bytes;
  };
  std::shared_ptr<State> state_;
};

}  // namespace ps
