// Exact unsigned 64-bit division by a divisor fixed at run time, without the
// divide instruction: placement computes a shard and a local row for every id
// of a batch, and a 64-bit `div` costs tens of cycles where this costs a
// multiply, a compare and an add.
//
//   FastDivider three(3);
//   uint64_t q = three.quotient(10);   // 3
//   uint64_t r = three.remainder(10);  // 1
//
// The quotient is first estimated with m = floor(2^64 / d), which is exact or
// one short for every 64-bit x, then corrected once (see quotient()).
#pragma once

#include <cstdint>

namespace ps {

class FastDivider {
 public:
  // d == 0 is taken as 1 (callers keep their divisors at least 1).
  explicit FastDivider(uint64_t d = 1)
      : d_(d == 0 ? 1 : d), m_(d_ == 1 ? 0 : uint64_t(((unsigned __int128)1 << 64) / d_)) {}

  uint64_t divisor() const { return d_; }

  // floor(x / d) and x - d * floor(x / d), both exact for every x.
  void divide(uint64_t x, uint64_t& q, uint64_t& r) const {
    if (d_ == 1) {
      q = x;
      r = 0;
      return;
    }
    // x * m / 2^64 lies in (x/d - 1, x/d], so its floor is q or q - 1.
    q = uint64_t(((unsigned __int128)x * m_) >> 64);
    r = x - q * d_;
    if (r >= d_) {
      ++q;
      r -= d_;
    }
  }
  uint64_t quotient(uint64_t x) const {
    uint64_t q, r;
    divide(x, q, r);
    return q;
  }
  uint64_t remainder(uint64_t x) const {
    uint64_t q, r;
    divide(x, q, r);
    return r;
  }

 private:
  uint64_t d_;
  uint64_t m_;  // floor(2^64 / d), unused for d == 1
};

}  // namespace ps
