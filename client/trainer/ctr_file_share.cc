// One worker's part of a click-data file (read_ctr_share): counted, then
// read with the other workers' lines skipped unparsed.
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "ps/ctr_data.h"
#include "ps/errors.h"

namespace ps {
namespace {

// Calls options.progress about every progress_seconds; looks at the clock
// once in 4096 lines.
class ProgressClock {
 public:
  explicit ProgressClock(const CtrShareOptions& o)
      : o_(o), next_(std::chrono::steady_clock::now() + period()) {}
  void tick(const char* doing, const CtrReader& r) {
    if (!o_.progress || (++lines_ & 4095) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_) return;
    next_ = now + period();
    o_.progress(doing, r.bytes_read(), r.file_bytes());
  }

 private:
  std::chrono::steady_clock::duration period() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(o_.progress_seconds));
  }
  const CtrShareOptions& o_;
  std::chrono::steady_clock::time_point next_;
  uint64_t lines_ = 0;
};

}  // namespace

CtrShare read_ctr_share(const std::string& path, const CtrShareOptions& o) {
  if (o.workers < 1 || o.worker < 0 || o.worker >= o.workers)
    throw ConfigError(fmt::format("{}: worker {} of {} workers", path, o.worker, o.workers));
  if (!(o.holdout >= 0 && o.holdout < 1))
    throw ConfigError(fmt::format("{}: holdout must be in [0, 1), got {}", path, o.holdout));
  const auto within_max = [&](int64_t i) { return o.max_examples < 0 || i < o.max_examples; };
  ProgressClock clock(o);
  CtrShare s;
  // The count first: where the held-out part starts (as CtrSynthetic's
  // holdout_begin(), so a generated file's planted figures are for the same
  // examples), and whether what is kept fits in memory.
  {
    CtrReader counter(path);
    while (within_max(s.examples) && counter.skip()) {
      ++s.examples;
      clock.tick("counting the examples in", counter);
    }
  }
  s.train_end = s.examples - std::llround(static_cast<double>(s.examples) * o.holdout);
  const int64_t train = o.keep_train ? ctr_share_size(s.train_end, o.worker, o.workers) : 0;
  const int64_t held = o.keep_holdout ? s.examples - s.train_end : 0;
  if (train + held == 0) return s;
  check_ctr_examples_fit(train + held, o.extra_bytes_each,
                         path + " (this worker's share" + o.too_large_hint + ")");
  s.train.reserve(static_cast<std::size_t>(train));
  s.holdout.reserve(static_cast<std::size_t>(held));
  // Then the examples kept, the read ending after the last of them.
  const int64_t last = o.keep_holdout ? s.examples : s.train_end;
  CtrReader reader(path);
  int64_t i = 0;
  for (; i < last; ++i) {
    const bool is_train = i < s.train_end;
    const bool keep = is_train ? o.keep_train && i % o.workers == o.worker : o.keep_holdout;
    bool more;
    if (keep) {
      std::vector<CtrExample>& to = is_train ? s.train : s.holdout;
      more = reader.next(to.emplace_back());
      if (!more) to.pop_back();
    } else {
      more = reader.skip();
    }
    if (!more) break;
    clock.tick("reading", reader);
  }
  if (i < last) {
    throw ConfigError(fmt::format("{}: ended after {} examples, {} counted (did it change?)", path,
                                  i, s.examples));
  }
  return s;
}

CtrShareStream::CtrShareStream(std::string path, int worker, int workers, int64_t train_end)
    : path_(std::move(path)), worker_(worker), workers_(workers), train_end_(train_end) {
  if (workers < 1 || worker < 0 || worker >= workers)
    throw ConfigError(fmt::format("{}: worker {} of {} workers", path_, worker, workers));
  share_size_ = ctr_share_size(train_end, worker, workers);
  if (share_size_ == 0)
    throw ConfigError(
        fmt::format("{}: no training examples for worker {} of {}", path_, worker, workers));
}

void CtrShareStream::next(std::size_t n, std::vector<CtrExample>& out) {
  out.clear();
  try {
    fill(n, out);
  } catch (...) {
    // The reader is past the line that failed: the next call starts over.
    reader_.reset();
    out.clear();
    throw;
  }
}

void CtrShareStream::fill(std::size_t n, std::vector<CtrExample>& out) {
  while (out.size() < n) {
    if (!reader_ || at_ >= train_end_) {
      if (reader_ && !out.empty()) return;  // the share's end cuts a batch short
      reader_.emplace(path_);
      at_ = 0;
    }
    const bool mine = at_ % workers_ == worker_;
    const bool more = mine ? reader_->next(out.emplace_back()) : reader_->skip();
    if (!more) {
      if (mine) out.pop_back();
      throw ConfigError(fmt::format("{}: ended after {} examples, {} expected (did it change?)",
                                    path_, at_, train_end_));
    }
    ++at_;
  }
}

}  // namespace ps
