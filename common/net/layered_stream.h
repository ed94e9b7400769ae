// A ps::SocketStream whose bytes go through another stream layered on the
// socket (a TLS session, common/net/tls.h), so that psd's and the client's
// message streams run over it unchanged.
//
// The socket's own shortcuts do not reach through the layer: reads are not
// landed straight into a caller's buffer from the kernel (land_next_read,
// limit_read_ahead and release do nothing), and read_exact reads into
// memory of the stream's own and copies each piece to where(offset) as it
// arrives, so a destination that changes between reads is never written
// after the change. abort, detect_dead_peer and the socket options act on
// the socket underneath. hold_until_sent keeps its promise: a piece is
// released once the layer has taken it (a TLS layer has encrypted it).
//
//   kj::Own<SocketStream> socket = wrap_socket(port, fd);
//   SocketStream& under = *socket;
//   kj::Own<kj::AsyncIoStream> tls = co_await context.wrapServer(kj::mv(socket));
//   kj::Own<SocketStream> stream = layer_socket(kj::mv(tls), under);
#pragma once

#include <functional>

#include <kj/array.h>
#include <kj/async-io.h>

#include "common/net/socket_stream.h"

namespace ps {

// `top` carries the bytes; `socket` is the socket under it, owned (directly
// or not) by `top`, so it lives as long as the returned stream. `explain`,
// if given, rewrites the layer's read and write failures (OpenSSL's error
// stack) into what a person can act on.
using ExplainFailure = std::function<kj::Exception(kj::Exception&&)>;
kj::Own<SocketStream> layer_socket(kj::Own<kj::AsyncIoStream> top, SocketStream& socket,
                                   ExplainFailure explain = nullptr);

// `socket` with `first` (bytes already read from it, to tell what speaks on
// it) handed out again before the rest: for psd, which reads the first byte
// of a connection to tell a TLS client from a plaintext one.
kj::Own<kj::AsyncIoStream> replay_first(kj::Array<kj::byte> first, kj::Own<SocketStream> socket);

}  // namespace ps
