#include "client/trainer/zipf.h"

namespace ps::detail {
namespace {

// log(1 + x) / x, and its limit 1 at 0.
double log1p_over_x(double x) {
  return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}
// (e^x - 1) / x, and its limit 1 at 0.
double expm1_over_x(double x) {
  return std::fabs(x) > 1e-8 ? std::expm1(x) / x
                             : 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x));
}

}  // namespace

ZipfSampler::ZipfSampler(int64_t n, double s) : n_(n), s_(s) {
  h_integral_x1_ = h_integral(1.5) - 1.0;
  h_integral_n_ = h_integral(static_cast<double>(n) + 0.5);
  shortcut_ = 2.0 - h_integral_inverse(h_integral(2.5) - h(2.0));
}

// Integral of x^-s from 1 to x: (x^(1-s) - 1) / (1 - s), log(x) at s = 1.
double ZipfSampler::h_integral(double x) const {
  const double log_x = std::log(x);
  return expm1_over_x((1.0 - s_) * log_x) * log_x;
}

double ZipfSampler::h_integral_inverse(double x) const {
  double t = x * (1.0 - s_);
  if (t < -1.0) t = -1.0;
  return std::exp(log1p_over_x(t) * x);
}

double zipf_normalizer(int64_t n, double s) {
  double sum = 0;
  for (int64_t k = n; k >= 1; --k)
    sum += std::pow(static_cast<double>(k), -s);  // small terms first
  return sum;
}

}  // namespace ps::detail
