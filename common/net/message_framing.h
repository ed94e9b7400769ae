// The Cap'n Proto stream framing that psd's and libpsclient's message
// streams write: a segment table, then the segments.
#pragma once

#include <cstdint>

#include <capnp/common.h>
#include <kj/array.h>
#include <kj/common.h>

#include "common/net/socket_stream.h"

namespace ps {

// Segments a message may have, as capnp's own reader allows.
constexpr uint32_t kMaxSegments = 512;

// The segment table: count - 1, then each segment's size in words, padded
// to a whole word.
kj::Array<uint32_t> segment_table(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments);

// Bytes of the segment table of a message with `count` segments.
constexpr size_t segment_table_bytes(uint32_t count) {
  return ((size_t{count} + 2) & ~size_t{1}) * sizeof(uint32_t);
}

// The socket's send buffer size (capnp::MessageStream::getSendBufferSize:
// the RPC layer's flow-control hint); null if it cannot be had.
kj::Maybe<int> send_buffer_size(SocketStream& stream);

}  // namespace ps
