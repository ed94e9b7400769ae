// A kj::AsyncIoStream over a connected socket, for Cap'n Proto connections
// (psd's and libpsclient's), that spends fewer system calls per message
// than kj's own stream.
//
// kj 0.9 reads a message in three or four read() calls (first word, segment
// table, segments) plus one that finds the socket empty; on a VM each system
// call is a good part of a small pull's round trip (docs/performance.md,
// "Figures behind design choices in the code"). This stream reads into a
// 64 KiB buffer, so a small message takes one read(), and skips the read
// that would find the socket empty
// when the previous one came back short. Reads larger than the buffer go
// straight into the caller's memory (a large tensor is not copied twice).
//
// It needs only a kj::UnixEventPort, so libpsclient can run it on an event
// loop it owns (common/net/client_loop.h).
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>

#include <kj/async-io.h>
#include <kj/async-unix.h>

#include "common/net/connection_control.h"

namespace ps {

// The socket as its message stream sees it. What the layers above the
// message stream may ask of it (hold_until_sent, abort) is the
// ConnectionControl part (common/net/connection_control.h).
class SocketStream : public kj::AsyncIoStream, public ConnectionControl {
 public:
  // Reads exactly `bytes` (fails on end of stream first), each piece to
  // where(offset), which is asked again before every system call: the
  // memory can be changed between them (a caller that gave up on a reply
  // whose bytes were going straight into its buffer; client/client_message_stream.h).
  virtual kj::Promise<void> read_exact(size_t bytes,
                                       kj::Function<kj::byte*(size_t offset)> where) = 0;

  // Small reads ask the kernel for 64 KiB, into a buffer of the stream's
  // own (one system call for several small messages); this lowers that to
  // `bytes` until the next call (SIZE_MAX: back to 64 KiB). A reader that
  // expects bytes it will have read_exact put elsewhere lowers it, so that
  // they stay in the socket instead of being read into the buffer and
  // copied out of it.
  virtual void limit_read_ahead(size_t bytes) = 0;

  // The next read into the stream's buffer (one that finds it empty) puts
  // its first `before` bytes there, the next dest.size() straight into
  // `dest`, and what follows back into the buffer, in one system call. For
  // a reader that can tell where a large piece of the next message starts
  // (client/client_message_stream.h: a pull reply's tensor after its first
  // segment): read_exact into `dest` then finds those bytes in place
  // instead of spending a second read() on them. If the guess was wrong the
  // bytes are still handed out in stream order, copied from `dest` to
  // wherever the reads ask for them, so `dest` is scratch memory until they
  // are taken. One read uses it; {0, nullptr} withdraws it.
  virtual void land_next_read(size_t before, kj::ArrayPtr<kj::byte> dest) = 0;

  // Before `region` stops being the stream's to write: bytes read into it
  // and not yet taken move to memory of the stream's own, and a landing
  // into it is withdrawn.
  virtual void release(kj::ArrayPtr<const kj::byte> region) = 0;

  // read()/readv() calls made so far (for tests and benchmarks).
  virtual uint64_t read_calls() const = 0;

  // A TCP peer whose host vanishes (powered off, cut off by the network)
  // sends no FIN or RST: without this the connection looks open for hours
  // (Linux's keepalive starts after two idle hours, if asked for), and psd
  // would wait on that worker, a client on that psd. With this, the kernel
  // probes an idle connection and gives up on unacknowledged data, so
  // reads and writes fail about `after` past the peer's last sign of life
  // (keepalive and TCP_USER_TIMEOUT). No effect on Unix sockets, nor
  // with `after` = 0.
  virtual void detect_dead_peer(std::chrono::milliseconds after) = 0;
};

class BusyPoll;

// A TCP connection whose two ends are on one host (a loopback address, or
// the host's own address at both ends) gets a fixed send buffer of
// same_host_send_buffer_bytes() (wrap_socket and connect_socket set it;
// the kernel may allow less, net.core.wmem_max). The kernel copies every
// byte twice there, into the socket and out of it; Linux's autotuned
// buffers (up to 4 MiB) let megabytes wait between the two copies. On the
// machines measured here (1 MiB of L2 per core), buffers of 512 KiB and
// 1 MiB moved 4-64 MiB pulls 1.2-1.6x as fast as autotuned ones or 1.5 MiB
// (`PS_SAME_HOST_SEND_BUFFER_KB=0|512|1024|1536 push_pull_bench`), likely
// because the second copy then finds the bytes still in the cache (no
// PMU there to count misses). Connections to other hosts keep autotuning:
// a fixed buffer would cap them at buffer / round-trip time. On a fixed
// buffer, a read waiting for a large remainder raises the socket's
// low-water mark to at most half of it (none under 256 KiB): a mark the
// peer's buffer can barely fill waits for the delayed acknowledgement.
bool same_host_connection(const sockaddr_storage& local, const sockaddr_storage& peer);

// Half the L2 cache as glibc reports it, held to 256 KiB-1 MiB (512 KiB
// where unknown); the environment variable PS_SAME_HOST_SEND_BUFFER_KB
// overrides it (0: leave these connections to autotuning too; a value that
// is not a whole number of KiB up to 65536 is ignored). Read once.
int same_host_send_buffer_bytes();

// Fixes `fd`'s send buffer so that SO_SNDBUF reads back `bytes` (Linux
// doubles what it is given; net.core.wmem_max may cap it lower).
void set_send_buffer(int fd, int bytes);

// Takes ownership of `fd` (made non-blocking, TCP_NODELAY, the send buffer
// above, closed with the stream). With `busy_poll`, each read that brings
// data kicks it.
kj::Own<SocketStream> wrap_socket(kj::UnixEventPort& port, int fd, BusyPoll* busy_poll = nullptr);

// Connects to "host:port", "[v6addr]:port" or "unix:/path", trying every
// address the name resolves to. Host names are resolved on a short-lived
// thread, so a slow DNS server does not stall the event loop.
kj::Promise<kj::Own<SocketStream>> connect_socket(kj::UnixEventPort& port,
                                                  const std::string& address);

}  // namespace ps
