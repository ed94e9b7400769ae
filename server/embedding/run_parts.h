// How an embedding table spreads one large request over threads: run(parts,
// fn) calls fn(0) .. fn(parts - 1), up to `threads` of them at once, and
// returns once every call has returned. psd passes its compute pool's
// (ComputePool::run_parts, psd --table_threads); the default runs every part
// on the caller. fn must not throw.
#pragma once

#include <cstddef>
#include <functional>

namespace ps {

using PartFn = std::function<void(std::size_t part)>;

struct RunParts {
  unsigned threads = 1;  // the caller's included
  std::function<void(std::size_t parts, const PartFn& fn)> run;
};

}  // namespace ps
