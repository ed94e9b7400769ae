// The NaN/Inf check psd applies to every gradient it is sent, shared with
// libpsclient, which runs it over a gradient that goes out in several
// requests (client/client_transfer.cc): psd checks each request whole, so
// only the client can refuse such a push before any of it is applied.
#pragma once

#include <cstddef>
#include <limits>
#include <span>

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

}  // namespace ps
