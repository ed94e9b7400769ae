// The NaN/Inf check psd applies to every gradient it is sent, shared with
// libpsclient, which runs it over a gradient that goes out in several
// requests (client/client_transfer.cc): psd checks each request whole, so
// only the client can refuse such a push before any of it is applied.
// Also the bound that keeps an initializer's random draws finite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "ps/job.h"
#include "ps/tensor_spec.h"

namespace ps {

// True when every |x| <= limit: no NaN or +-Inf, whatever the limit (at
// most FLT_MAX). psd lowers it for sync mode, whose sum of several
// gradients must not overflow.
bool all_finite(std::span<const float> v, float limit = std::numeric_limits<float>::max());

// Copies src to dst and says whether every value was within `limit` as
// above, in one pass (a gradient psd reads out of shared memory: what is
// checked is exactly what is applied).
bool copy_all_finite(float* __restrict dst, const float* __restrict src, std::size_t n,
                     float limit = std::numeric_limits<float>::max());

// How many gradients psd sums per step before it divides: sync mode's
// replicas_to_aggregate, 1 in the other modes (each push applied alone).
uint32_t gradients_summed_per_step(const JobConfig& job);

// The largest magnitude psd accepts in a gradient of which `summed` are
// added up: about FLT_MAX / summed, low enough that their sum, added one at
// a time in float, stays finite (two workers' 3e38, whose average is
// finite, summed to Inf and was applied).
float gradient_limit(uint32_t summed);

// psd's refusal of a push whose gradient for `tensor` failed
// all_finite(values, gradient_limit(summed)): one text for psd and for the
// client's own check of pushes it splits, which must refuse alike.
std::string gradient_refusal(std::string_view tensor, std::span<const float> values,
                             uint32_t summed);

// Whether every draw of a uniform or normal initializer is a finite float:
// high - low, and |mean| + 16 stddev (a float normal stays within about 6
// sigma, a truncated one within 2), within FLT_MAX. True for other kinds.
// Dense tensors (server/initializer.cc) and embedding tables both hold to it.
bool draws_stay_finite(const InitConfig& init);

}  // namespace ps
