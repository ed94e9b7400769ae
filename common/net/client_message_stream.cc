#include "common/net/client_message_stream.h"

#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>
#include <kj/debug.h>

#include "common/net/message_framing.h"
#include "schema/ps.capnp.h"
#include "common/random_bits.h"

namespace ps {

struct ClientMessageStream::Destinations : kj::Refcounted {
  uint64_t tag = 0;
  std::vector<kj::ArrayPtr<kj::byte>> buffers;
  bool landable = false;      // a buffer for a tensor psd sends as a segment of its own
  size_t first_landable = 0;  // the index of the first such buffer
  uint64_t shape = 0;  // a hash of the buffers' sizes: pulls alike get replies laid out alike
  ClientMessageStream* owner = nullptr;  // null once withdrawn (or the stream is gone)
  bool withdrawn() const { return owner == nullptr; }
};

// Read-only zero pages standing in for the segments not read yet, while the
// first segment is parsed: a tensor whose bytes point into this range is
// known to be in segment k at offset o before segment k arrives. Reading
// them (a landing pad in a later segment) finds zeros, a null pointer.
class ClientMessageStream::Placeholder {
 public:
  ~Placeholder() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  const capnp::word* reserve(size_t bytes) {
    if (bytes > size_) {
      if (base_ != nullptr) ::munmap(base_, size_);
      base_ = nullptr;
      const size_t size = (bytes + (1u << 20) - 1) & ~size_t{(1u << 20) - 1};
      void* p =
          ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) KJ_FAIL_SYSCALL("mmap", errno, size);
      base_ = p;
      size_ = size;
    }
    return static_cast<const capnp::word*>(base_);
  }

 private:
  void* base_ = nullptr;
  size_t size_ = 0;
};

struct ClientMessageStream::Incoming {
  capnp::ReaderOptions options;
  uint32_t header[2] = {0, 0};
  kj::Array<uint32_t> more_sizes;
  std::vector<size_t> words;     // per segment
  kj::Array<capnp::word> first;  // segment 0 (or all segments, when none can land)
  kj::Array<capnp::word> rest;   // the segments that do not land, in order
  struct Landing {
    kj::Own<Destinations> dest;  // null: read into `rest`
    size_t index = 0;
    kj::Array<capnp::word> sink;  // where the bytes go once the pull withdrew
    size_t rest_offset = 0;
  };
  std::vector<Landing> landings;
  kj::Array<kj::ArrayPtr<const capnp::word>> segments;

  kj::byte* sink_for(size_t k) {
    auto& l = landings[k];
    if (l.sink == nullptr) {
      l.sink = kj::heapArray<capnp::word>(words[k]);
      std::memset(l.sink.begin(), 0, l.sink.size() * sizeof(capnp::word));
    }
    return reinterpret_cast<kj::byte*>(l.sink.begin());
  }
};

class ClientMessageStream::Received final : public capnp::MessageReader {
 public:
  Received(capnp::ReaderOptions options, kj::Own<Incoming> in)
      : capnp::MessageReader(options), in_(kj::mv(in)) {}
  kj::ArrayPtr<const capnp::word> getSegment(uint id) override {
    return id < in_->segments.size() ? in_->segments[id] : nullptr;
  }

 private:
  kj::Own<Incoming> in_;
};

ClientMessageStream::ClientMessageStream(SocketStream& stream)
    : stream_(stream), next_tag_(random_u64()), placeholder_(kj::heap<Placeholder>()) {}

ClientMessageStream::~ClientMessageStream() noexcept(false) {
  for (auto& [tag, d] : expected_) d->owner = nullptr;
}

ClientMessageStream::Expectation::Expectation(kj::Own<Destinations> dest) : dest_(kj::mv(dest)) {}

ClientMessageStream::Expectation::~Expectation() {
  if (auto* owner = dest_->owner) {
    if (dest_->landable) owner->stream_.release(dest_->buffers[dest_->first_landable]);
    owner->expected_.erase(dest_->tag);
    if (dest_->landable && --owner->landable_ == 0) owner->stream_.limit_read_ahead(SIZE_MAX);
    dest_->owner = nullptr;
  }
}

uint64_t ClientMessageStream::Expectation::tag() const { return dest_->tag; }

kj::Own<ClientMessageStream::Expectation> ClientMessageStream::expect(
    std::vector<kj::ArrayPtr<kj::byte>> buffers) {
  auto d = kj::refcounted<Destinations>();
  // Random start, then consecutive: a reply to something else whose first
  // words happen to read as a pending tag is as good as impossible.
  do {
    d->tag = next_tag_++;
  } while (d->tag == 0 || expected_.count(d->tag) != 0);
  d->buffers = std::move(buffers);
  // psd sends only these as segments of their own: a smaller tensor comes
  // in the first segment, read whole (limiting read-ahead would cost it a
  // system call).
  d->shape = 14695981039346656037ull;  // FNV-1a over the sizes
  for (size_t i = 0; i < d->buffers.size(); ++i) {
    const size_t size = d->buffers[i].size();
    if (!d->landable && size >= wire::K_PULL_SEGMENT_BYTES) {
      d->landable = true;
      d->first_landable = i;
    }
    d->shape = (d->shape ^ size) * 1099511628211ull;
  }
  d->owner = this;
  expected_.emplace(d->tag, d.get());
  if (d->landable) {
    if (landable_++ == 0) {
      stream_.limit_read_ahead(kLandingReadAhead);
      // The only pull that can land: if one like it was answered before,
      // its reply's first tensor most likely starts where that one's did.
      auto known = prefix_bytes_.find(d->shape);
      if (known != prefix_bytes_.end())
        stream_.land_next_read(known->second, d->buffers[d->first_landable]);
    } else {
      stream_.land_next_read(0, nullptr);  // which reply comes first is anyone's guess
    }
  }
  return kj::heap<Expectation>(kj::mv(d));
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> ClientMessageStream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd>, capnp::ReaderOptions options, kj::ArrayPtr<capnp::word>) {
  auto in = kj::heap<Incoming>();
  in->options = options;
  auto* raw = in.get();
  return stream_.tryRead(raw->header, sizeof(raw->header), sizeof(raw->header))
      .then([this, in = kj::mv(in)](
                size_t n) mutable -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        if (n == 0) return kj::Maybe<capnp::MessageReaderAndFds>(nullptr);
        // Plain KJ_REQUIREs, not their recovery-block form: exceptions are
        // on, so a recovery block's return value is made and then, built
        // with clang, leaked when the check throws (fuzz/message_stream_fuzz).
        KJ_REQUIRE(n == sizeof(in->header), "premature EOF");
        const uint32_t count = in->header[0] + 1;
        KJ_REQUIRE(count > 0 && count <= kMaxSegments, "message has too many segments", count);
        if (count == 1) return read_body(kj::mv(in));
        in->more_sizes = kj::heapArray<uint32_t>(count & ~1u);  // padded to a whole word
        auto* raw = in.get();
        return stream_.read(raw->more_sizes.begin(), raw->more_sizes.size() * sizeof(uint32_t))
            .then([this, in = kj::mv(in)]() mutable { return read_body(kj::mv(in)); });
      });
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> ClientMessageStream::read_body(
    kj::Own<Incoming> in) {
  const uint32_t count = in->header[0] + 1;
  in->words.resize(count);
  in->words[0] = in->header[1];
  uint64_t total = in->words[0];
  bool large = false;
  for (uint32_t k = 1; k < count; ++k) {
    in->words[k] = in->more_sizes[k - 1];
    total += in->words[k];
    large = large || in->words[k] * sizeof(capnp::word) >= kMinLandingBytes;
  }
  KJ_REQUIRE(total <= in->options.traversalLimitInWords,
             "message is too large; see capnp::ReaderOptions", total);
  in->landings.resize(count);
  auto* raw = in.get();
  if (expected_.empty() || !large) {
    // Nothing can land: one read for all segments, as capnp does.
    raw->first = kj::heapArray<capnp::word>(total);
    return stream_.read(raw->first.begin(), total * sizeof(capnp::word))
        .then([this, in = kj::mv(in)]() mutable {
          return kj::Maybe<capnp::MessageReaderAndFds>(finish(kj::mv(in)));
        });
  }
  raw->first = kj::heapArray<capnp::word>(raw->words[0]);
  return stream_.read(raw->first.begin(), raw->words[0] * sizeof(capnp::word))
      .then([this, raw] {
        plan_landings(*raw);
        size_t rest = 0;
        for (size_t k = 1; k < raw->words.size(); ++k) {
          if (raw->landings[k].dest.get() != nullptr) continue;
          raw->landings[k].rest_offset = rest;
          rest += raw->words[k];
        }
        raw->rest = kj::heapArray<capnp::word>(rest);
        return read_segments(*raw, 1);
      })
      .then([this, in = kj::mv(in)]() mutable {
        return kj::Maybe<capnp::MessageReaderAndFds>(finish(kj::mv(in)));
      });
}

void ClientMessageStream::plan_landings(Incoming& in) {
  const size_t count = in.words.size();
  std::vector<size_t> start(count, 0);  // word offset of segment k in the placeholder
  size_t later = 0;
  for (size_t k = 1; k < count; ++k) {
    start[k] = later;
    later += in.words[k];
  }
  const capnp::word* base = placeholder_->reserve(later * sizeof(capnp::word));
  auto segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(count);
  segments[0] = in.first.asPtr();
  for (size_t k = 1; k < count; ++k) segments[k] = kj::arrayPtr(base + start[k], in.words[k]);

  capnp::ReaderOptions options;
  options.traversalLimitInWords = 2 * (later + in.words[0]) + 1024;
  capnp::SegmentArrayMessageReader reader(segments, options);
  auto failure = kj::runCatchingExceptions([&] {
    auto message = reader.getRoot<capnp::rpc::Message>();
    if (!message.isReturn()) return;
    auto ret = message.getReturn();
    if (!ret.isResults()) return;
    auto results = ret.getResults().getContent().getAs<wire::Shard::PullResults>();
    auto it = expected_.find(results.getTag());
    if (it == expected_.end()) return;
    Destinations& d = *it->second;
    auto tensors = results.getTensors();
    if (tensors.size() != d.buffers.size()) return;
    const auto* lo = reinterpret_cast<const kj::byte*>(base);
    const auto* hi = lo + later * sizeof(capnp::word);
    for (unsigned i = 0; i < tensors.size(); ++i) {
      auto values = tensors[i].getValues();
      const kj::byte* p = values.begin();
      if (values.size() < kMinLandingBytes || p < lo || p >= hi) continue;
      const size_t offset = static_cast<size_t>(p - lo);
      if (offset % sizeof(capnp::word) != 0) continue;
      auto at = std::lower_bound(start.begin() + 1, start.end(), offset / sizeof(capnp::word));
      if (at == start.end() || *at != offset / sizeof(capnp::word)) continue;
      const size_t k = static_cast<size_t>(at - start.begin());
      const auto& buffer = d.buffers[i];
      if (in.words[k] * sizeof(capnp::word) != values.size() || buffer.size() != values.size() ||
          reinterpret_cast<uintptr_t>(buffer.begin()) % sizeof(capnp::word) != 0 ||
          in.landings[k].dest.get() != nullptr) {
        continue;
      }
      in.landings[k].dest = kj::addRef(d);
      in.landings[k].index = i;
    }
  });
  if (failure != nullptr) {
    // Not a reply this stream understands: read it as capnp would, and let
    // the RPC layer report what is wrong with it.
    for (auto& l : in.landings) l.dest = nullptr;
  }
}

kj::Promise<void> ClientMessageStream::read_segments(Incoming& in, size_t k) {
  const size_t count = in.words.size();
  if (k >= count) return kj::READY_NOW;
  if (in.landings[k].dest.get() != nullptr) {
    return stream_
        .read_exact(in.words[k] * sizeof(capnp::word),
                    [&in, k](size_t offset) -> kj::byte* {
                      auto& l = in.landings[k];
                      if (l.dest->withdrawn()) return in.sink_for(k) + offset;
                      return l.dest->buffers[l.index].begin() + offset;
                    })
        .then([this, &in, k] { return read_segments(in, k + 1); });
  }
  // A run of segments that do not land, in one read.
  size_t end = k, words = 0;
  while (end < count && in.landings[end].dest.get() == nullptr) words += in.words[end++];
  return stream_.read(in.rest.begin() + in.landings[k].rest_offset, words * sizeof(capnp::word))
      .then([this, &in, end] { return read_segments(in, end); });
}

capnp::MessageReaderAndFds ClientMessageStream::finish(kj::Own<Incoming> in) {
  const size_t count = in->words.size();
  in->segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(count);
  bool lands = false;
  if (in->first.size() != in->words[0]) {
    // Read in one piece.
    size_t at = 0;
    for (size_t k = 0; k < count; ++k) {
      in->segments[k] = kj::arrayPtr(in->first.begin() + at, in->words[k]);
      at += in->words[k];
    }
  } else {
    in->segments[0] = in->first.asPtr();
    for (size_t k = 1; k < count; ++k) {
      auto& l = in->landings[k];
      const capnp::word* from = nullptr;
      if (l.dest.get() == nullptr) {
        from = in->rest.begin() + l.rest_offset;
      } else if (l.dest->withdrawn()) {
        from = reinterpret_cast<const capnp::word*>(in->sink_for(k));
      } else {
        from = reinterpret_cast<const capnp::word*>(l.dest->buffers[l.index].begin());
        lands = true;
      }
      in->segments[k] = kj::arrayPtr(from, in->words[k]);
    }
  }
  if (lands) ++landed_messages_;
  if (count > 1) {
    // Learn where the first tensor starts in replies like this one.
    const auto& l = in->landings[1];
    if (l.dest.get() != nullptr && !l.dest->withdrawn() && l.index == l.dest->first_landable) {
      if (prefix_bytes_.size() >= kMaxKnownShapes) prefix_bytes_.clear();
      prefix_bytes_[l.dest->shape] = sizeof(in->header) + in->more_sizes.size() * sizeof(uint32_t) +
                                     in->words[0] * sizeof(capnp::word);
    }
  }
  auto options = in->options;
  return capnp::MessageReaderAndFds{kj::heap<Received>(options, kj::mv(in)), nullptr};
}

namespace {

bool is_finish(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  if (segments.size() != 1 || segments[0].size() > 16) return false;
  capnp::SegmentArrayMessageReader reader(segments);
  bool finish = false;
  auto failure =
      kj::runCatchingExceptions([&] { finish = reader.getRoot<capnp::rpc::Message>().isFinish(); });
  return failure == nullptr && finish;
}

}  // namespace

kj::Promise<void> ClientMessageStream::writeMessage(
    kj::ArrayPtr<const int>, kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  if (is_finish(segments)) {
    finishes_.add(capnp::messageToFlatArray(segments));
    return kj::READY_NOW;
  }
  return write_framed(segments);
}

kj::Promise<void> ClientMessageStream::writeMessages(
    kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) {
  kj::Promise<void> all = kj::READY_NOW;
  for (auto& m : messages) all = all.then([this, m] { return writeMessage(nullptr, m); });
  return all;
}

kj::Promise<void> ClientMessageStream::write_framed(
    kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  // The Finish messages held back go first, in the same system call.
  auto held = kj::mv(finishes_);
  finishes_ = kj::Vector<kj::Array<capnp::word>>();
  auto table = segments.size() == 0 ? kj::Array<uint32_t>() : segment_table(segments);
  auto pieces = kj::heapArray<kj::ArrayPtr<const kj::byte>>(
      held.size() + (segments.size() == 0 ? 0 : 1 + segments.size()));
  size_t i = 0;
  for (auto& f : held) pieces[i++] = f.asBytes();
  if (segments.size() > 0) {
    pieces[i++] = table.asBytes();
    for (auto& s : segments) pieces[i++] = s.asBytes();
  }
  auto* raw = pieces.begin();
  return stream_.write(kj::arrayPtr(raw, pieces.size()))
      .attach(kj::mv(pieces), kj::mv(table), kj::mv(held));
}

kj::Maybe<int> ClientMessageStream::getSendBufferSize() { return send_buffer_size(stream_); }

kj::Promise<void> ClientMessageStream::end() {
  return write_framed(nullptr).then([this] { stream_.shutdownWrite(); });
}

}  // namespace ps
