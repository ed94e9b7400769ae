// Zipf-distributed ranks: P(k) proportional to k^-s for k in [1, n], drawn
// in O(1) without tables by rejection-inversion (Hörmann and Derflinger,
// "Rejection-inversion to generate variates from monotone discrete
// distributions", 1996), so fields of 10^6 values cost no memory.
#pragma once

#include <cmath>
#include <cstdint>

namespace ps::detail {

class ZipfSampler {
 public:
  // n >= 1, s > 0 (checked by the caller).
  ZipfSampler(int64_t n, double s);

  int64_t n() const { return n_; }
  double exponent() const { return s_; }

  // A rank in [1, n]; `uniform` returns doubles in (0, 1).
  template <typename Uniform>
  int64_t sample(Uniform&& uniform) const {
    while (true) {
      const double u = h_integral_n_ + uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = h_integral_inverse(u);
      int64_t k = static_cast<int64_t>(x + 0.5);
      if (k < 1) k = 1;
      if (k > n_) k = n_;
      if (static_cast<double>(k) - x <= shortcut_ ||
          u >= h_integral(static_cast<double>(k) + 0.5) - h(k))
        return k;
    }
  }

 private:
  double h(double x) const { return std::exp(-s_ * std::log(x)); }
  double h_integral(double x) const;
  double h_integral_inverse(double x) const;

  int64_t n_;
  double s_;
  double h_integral_x1_;
  double h_integral_n_;
  double shortcut_;
};

// sum over k in [1, n] of k^-s (O(n)); P(k) = k^-s / zipf_normalizer(n, s).
double zipf_normalizer(int64_t n, double s);

}  // namespace ps::detail
