// One file for psd's listening side: accept, the connection rules (places,
// TLS, refusals) and the housekeeping share the list of connections.
#include "server/accept_retry.h"
#include "server/server.h"
#include "common/checkpoint/checkpoint_file.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>

#include <capnp/rpc-twoparty.h>
#include <kj/async-unix.h>
#include <spdlog/spdlog.h>

#include "server/connection_places.h"
#include "server/kj_log.h"
#include "server/log_limiter.h"
#include "server/monitoring_http.h"
#include "common/for_people.h"
#include "common/malloc_tuning.h"
#include "common/memory_budget.h"
#include "ps/errors.h"
#include "server/shard_service.h"
#include "common/net/buffered_message_stream.h"
#include "common/net/socket_stream.h"
#include "common/net/tls.h"
#include "common/net/busy_poll.h"

namespace ps {

namespace {

void write_port_file(const std::string& path, int port, const char* flag) {
  // Written whole and renamed, so a reader never sees a partial number.
  std::string tmp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp);
    written = static_cast<bool>(out << port << "\n") && static_cast<bool>(out.flush());
  }
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ConfigError(std::string("psd: cannot write ") + flag + " " + path + ": " + why);
  }
}

// One accepted connection: its stream, the messages read from it in place
// (common/net/buffered_message_stream.h), the two-party network over them and
// the RPC system serving a ShardServiceImpl as bootstrap.
struct Connection {
  Connection(kj::Own<SocketStream> s, Shard& shard, std::string peer, capnp::ReaderOptions reader,
             MemoryBudget* budget, ConnectionRules rules, std::string refusal = "",
             pid_t peer_pid = 0)
      : stream(kj::mv(s)),
        messages(*stream, budget),
        network(messages, capnp::rpc::twoparty::Side::SERVER, reader),
        rpc(capnp::makeRpcServer(network, kj::heap<ShardServiceImpl>(
                                              shard, std::move(peer), std::move(refusal),
                                              &messages.connection(), peer_pid, std::move(rules)))),
        replies(budget ? budget->reserve_anyway(MemoryUse::kReplies, 0)
                       : MemoryBudget::Reservation()) {}
  kj::Own<SocketStream> stream;
  BufferedMessageStream messages;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  // Its replies not yet written, by the memory they hold.
  MemoryBudget::Reservation replies;
  std::string host;    // the peer's address, for the per-address cap
  bool local = false;  // a Unix-socket peer
  ConnectionPlaces::Standing standing = ConnectionPlaces::Standing::kBeforeHello;
  // Closed to make room before its hello: its place is already given back.
  bool closed_for_room = false;
  uint64_t accepted = 0;  // its place in the order of accepts

  // Each queued reply holds a message builder whose first segment is capnp's
  // suggested size (8 KiB) however little it carries.
  static constexpr uint64_t kReplyOverheadBytes = 8u << 10;
  uint64_t queued_reply_bytes() {
    return network.getCurrentQueueSize() + network.getCurrentQueueCount() * kReplyOverheadBytes;
  }
  // Counts the replies queued now against the budget.
  void account_replies() { replies.resize_anyway(queued_reply_bytes()); }

  // A peer that sends requests and does not read the replies: past this
  // much queued for it (or one largest message), or with any queued while
  // psd's memory budget is spent, psd reads no more of its requests until
  // the queue drains. Before, psd queued every reply (a client stalled
  // after 20,000 pulls of 60 KB: 1.2 GB).
  void hold_reads_past_queued(uint64_t max_message_bytes, MemoryBudget& budget, kj::Timer& timer) {
    const uint64_t limit = std::max<uint64_t>(kMaxQueuedReplyBytes, max_message_bytes);
    messages.hold_reads_while(
        [this, limit, &budget] {
          const uint64_t queued = queued_reply_bytes();
          replies.resize_anyway(queued);
          return queued > limit || (queued > 0 && budget.available() == 0);
        },
        timer);
  }
  static constexpr uint64_t kMaxQueuedReplyBytes = 64u << 20;
};

std::string peer_name(kj::AsyncIoStream& stream, const std::string& fallback) {
  struct sockaddr_storage addr {};
  uint len = sizeof(addr);
  try {
    stream.getpeername(reinterpret_cast<struct sockaddr*>(&addr), &len);
    char host[64] = {};
    if (addr.ss_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
      return fmt::format("{}:{}", host, ntohs(in->sin_port));
    }
    if (addr.ss_family == AF_INET6) {
      auto* in = reinterpret_cast<sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
      return fmt::format("[{}]:{}", host, ntohs(in->sin6_port));
    }
  } catch (...) {
  }
  return fallback;
}

// The process at the other end of a Unix-domain connection, as the kernel
// recorded it at connect (0: unknown).
pid_t peer_pid(kj::AsyncIoStream& stream) {
  KJ_IF_MAYBE (fd, stream.getFd()) {
    struct ucred cred {};
    socklen_t len = sizeof(cred);
    if (::getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) return cred.pid;
  }
  return 0;
}

// Makes `path` free for psd's Unix socket: nothing there, or a stale socket
// (removed). Refuses a socket another process listens on, and any other
// file: neither is psd's to remove.
void claim_unix_socket_path(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  const std::string where = "psd: cannot listen on unix:" + path + " (--unix_socket): ";
  if (!S_ISSOCK(st.st_mode)) {
    throw ConfigError(where + "the path exists and is not a socket (psd removes only a stale "
                              "socket there): give a path of its own");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() < sizeof(addr.sun_path)) {
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      const bool listening =
          ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 || errno == EAGAIN;
      ::close(fd);
      if (listening) {
        throw ConfigError(where + "another process listens there (another psd?): stop it, or "
                                  "give another path");
      }
    }
  }
  ::unlink(path.c_str());
}

// The socket file psd bound (device and inode), so that psd removes it
// at exit only while it is still its own.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  static FileId of(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return {};
    return {st.st_dev, st.st_ino};
  }
  bool operator==(const FileId&) const = default;
};

}  // namespace

struct PsServer::Impl final : kj::TaskSet::ErrorHandler {
  Impl(ServerOptions o, kj::AsyncIoContext& io)
      : options(advertise_unix_socket(std::move(o))),
        io(io),
        pool(options.threads),
        busy_poll(io.unixEventPort, std::chrono::microseconds(options.busy_poll_us)),
        budget(options.max_memory_bytes),
        places(options.max_connections, options.max_connections_per_peer),
        shard(options.shard, pool, io.provider->getTimer(), &budget),
        tasks(kj::heap<kj::TaskSet>(*this)) {
    if (!options.tls.cert.empty() || !options.tls.key.empty() || !options.tls.client_ca.empty())
      tls = std::make_unique<TlsServer>(options.tls);
    if (!options.checkpoint.dir.empty()) {
      checkpointer = std::make_unique<Checkpointer>(options.checkpoint, shard, &budget);
      shard.set_checkpointer(checkpointer.get());
    }
  }

  // Clients on this host are told the Unix socket's absolute path in hello.
  static ServerOptions advertise_unix_socket(ServerOptions o) {
    if (!o.unix_socket.empty())
      o.shard.unix_socket = std::filesystem::absolute(o.unix_socket).string();
    return o;
  }

  void taskFailed(kj::Exception&& e) override {
    spdlog::warn("connection task failed: {}", e.getDescription().cStr());
  }

  kj::Promise<void> accept_loop(kj::ConnectionReceiver& listener, std::string kind) {
    // evalNow: kj's accept() throws at once when accept4() fails with the
    // socket ready (EMFILE), rather than rejecting.
    return kj::evalNow([&] { return listener.accept(); })
        .then(
            [this, &listener, kind](kj::Own<kj::AsyncIoStream>&& accepted) {
              const pid_t pid = kind == "unix" ? peer_pid(*accepted) : 0;
              kj::Own<SocketStream> stream = rewrap(kj::mv(accepted));
              if (!stream) {
                spdlog::warn("dropped a {} connection: cannot take over its socket: {}", kind,
                             strerror(errno));
                return accept_loop(listener, kind);
              }
              std::string peer = peer_name(*stream, kind);
              const bool local = kind == "unix";
              std::string host(LogLimiter::host_of(peer));
              if (places.make_room_before_hello(host, local, declared_workers()))
                close_oldest_before_hello();
              std::optional<std::string> why = places.refuse_connection(host, local);
              if (why) {
                uint64_t suppressed = 0;
                if (log_limiter.allow(peer, "refused connection", &suppressed)) {
                  spdlog::warn("refused a {} connection from {}: {}{}", kind, peer, *why,
                               LogLimiter::note(suppressed));
                }
                if (tls && kind == "tcp") {
                  refuse_tls(kj::mv(stream), std::move(peer), std::move(*why));
                } else {
                  serve_refusal(kj::mv(stream), std::move(peer), std::move(*why));
                }
                return accept_loop(listener, kind);
              }
              if (tls && kind == "tcp") {
                places.opened(host, local);
                serve_tls(kj::mv(stream), std::move(peer), std::move(host));
                return accept_loop(listener, kind);
              }
              places.opened(host, local);
              serve(kj::mv(stream), std::move(peer), std::move(host), local, pid);
              return accept_loop(listener, kind);
            },
            [this, &listener, kind](kj::Exception&& e) {
              log_accept_failure(kind, e);  // accept_retry.h
              return io.provider->getTimer().afterDelay(kAcceptRetry).then([this, &listener, kind] {
                return accept_loop(listener, kind);
              });
            });
  }

  // Serves a connection the rules let in (counted in `places` as opened).
  // `when`: its place in the order of accepts (0: now).
  void serve(kj::Own<SocketStream> stream, std::string peer, std::string host, bool local,
             pid_t pid, uint64_t when = 0) {
    capnp::ReaderOptions reader;
    reader.traversalLimitInWords = options.shard.max_message_bytes / sizeof(capnp::word) + 1024;
    reader.nestingLimit = 64;
    // The connection, once it is in the list (a hello can only come after this returns).
    auto self = std::make_shared<Connection*>(nullptr);
    ConnectionRules rules;
    rules.hello_deadline = options.hello_deadline_ms * kj::MILLISECONDS;
    rules.log = &log_limiter;
    rules.admit_hello = [this, self](const Caller& caller) {
      if ((*self)->closed_for_room) {
        throw RequestError(
            "hello: this connection was closed to make room for others (say hello as soon as "
            "connected)");
      }
      if (caller.worker_index >= 0 || caller.is_chief) return;
      const JobState& job = shard.job();
      if (auto no =
              places.refuse_anonymous_hello(job.configured() ? job.config().total_replicas : 0)) {
        throw RequestError(*no);
      }
    };
    rules.on_hello = [this, self](const Caller& caller) {
      Connection& c = **self;
      c.standing = caller.worker_index >= 0 || caller.is_chief
                       ? ConnectionPlaces::Standing::kMember
                       : ConnectionPlaces::Standing::kAnonymous;
      places.said_hello(c.host, c.local, c.standing);
      c.messages.set_max_message_bytes(UINT64_MAX);  // the reader's traversal limit still applies
    };
    auto it = connections.emplace(connections.end(), kj::mv(stream), shard, peer, reader, &budget,
                                  std::move(rules), "", pid);
    *self = &*it;
    it->host = host;
    it->local = local;
    it->accepted = when != 0 ? when : ++accept_count;
    it->messages.set_max_message_bytes(kMaxMessageBeforeHello);
    it->messages.yield_every(kMessagesPerTurn, io.provider->getTimer());
    it->messages.limit_unfinished_calls(kMaxUnfinishedCalls, kBytesPerUnfinishedCall);
    it->messages.limit_message_time(options.request_timeout_ms * kj::MILLISECONDS,
                                    kMinRequestBytesPerSec, io.provider->getTimer());
    it->hold_reads_past_queued(options.shard.max_message_bytes, budget, io.provider->getTimer());
    tasks->add(it->network.onDisconnect().then(
        [this, it] { drop(it); },
        [this, it, peer](kj::Exception&& e) {
          uint64_t suppressed = 0;
          if (log_limiter.allow(peer, "ended", &suppressed)) {
            spdlog::info("connection {} ended: {}{}", peer, e.getDescription().cStr(),
                         LogLimiter::note(suppressed));
          }
          drop(it);
        }));
  }

  // The TCP port under TLS (--tls_cert): a connection the rules let in
  // (counted as opened, before hello) is served once its handshake is done.
  // A plaintext client is answered, in its own protocol, that psd needs
  // TLS; a failed or late handshake closes the connection with a line in
  // the log. Either way psd serves on. Until its handshake ends it is a
  // connection before hello like any other: the oldest may be closed to
  // make room (close_oldest_before_hello).
  void serve_tls(kj::Own<SocketStream> socket, std::string peer, std::string host) {
    auto h = handshakes.emplace(handshakes.end());
    h->host = host;
    h->accepted = ++accept_count;
    auto closed = [this, host, h] {
      if (!h->closed_for_room) places.closed(host, false, ConnectionPlaces::Standing::kBeforeHello);
      handshakes.erase(h);
    };
    tasks->add(h->canceler.wrap(secure(kj::mv(socket), peer))
                   .then(
                       [this, peer, host, h, closed](TlsServer::Accepted a) mutable {
                         if (!a.plaintext) {
                           const uint64_t when = h->accepted;
                           handshakes.erase(h);
                           return serve(kj::mv(a.stream), peer, host, false, 0, when);
                         }
                         closed();
                         uint64_t suppressed = 0;
                         if (log_limiter.allow(peer, "plaintext on TLS", &suppressed)) {
                           spdlog::warn(
                               "refused a plaintext connection from {} (psd has --tls_cert){}",
                               peer, LogLimiter::note(suppressed));
                         }
                         serve_refusal(kj::mv(a.stream), peer, kPlaintextRefusal);
                       },
                       [closed](kj::Exception&&) { closed(); }));
  }

  // The TLS handshake on an accepted socket, within the hello deadline; a
  // failure is logged (rate-limited) and rejects.
  kj::Promise<TlsServer::Accepted> secure(kj::Own<SocketStream> socket, std::string peer) {
    const kj::Duration limit =
        (options.hello_deadline_ms > 0 ? options.hello_deadline_ms : 10000) * kj::MILLISECONDS;
    return tls->accept(kj::mv(socket))
        .exclusiveJoin(io.provider->getTimer().afterDelay(limit).then(
            []() -> kj::Promise<TlsServer::Accepted> {
              return KJ_EXCEPTION(DISCONNECTED, "no TLS handshake within --hello_timeout_secs");
            }))
        .catch_([this, peer](kj::Exception&& e) -> kj::Promise<TlsServer::Accepted> {
          uint64_t suppressed = 0;
          if (log_limiter.allow(peer, "TLS handshake", &suppressed)) {
            spdlog::warn("TLS connection from {} closed: {}{}", peer, e.getDescription().cStr(),
                         LogLimiter::note(suppressed));
          }
          return kj::mv(e);
        });
  }
  static constexpr const char* kPlaintextRefusal =
      "this psd requires TLS (psd --tls_cert): give the client the CA file that signed psd's "
      "certificate (--tls_ca, ClientOptions::tls_ca)";

  // The accepted socket as a ps::SocketStream (common/net/socket_stream.h):
  // fewer system calls per message than kj's own stream, and pull replies
  // sent from tensor memory. Null (errno set) if the fd cannot be had.
  kj::Own<SocketStream> rewrap(kj::Own<kj::AsyncIoStream> stream) {
    KJ_IF_MAYBE (fd, stream->getFd()) {
      const int copy = ::dup(*fd);
      if (copy >= 0) {
        auto wrapped = wrap_socket(io.unixEventPort, copy, &busy_poll);
        wrapped->detect_dead_peer(std::chrono::seconds(options.dead_peer_secs));
        return wrapped;
      }
    } else {
      errno = ENOTSOCK;
    }
    return kj::Own<SocketStream>();
  }

  void drop(std::list<Connection>::iterator it) {
    if (!it->closed_for_room) places.closed(it->host, it->local, it->standing);
    connections.erase(it);
  }

  uint32_t declared_workers() {
    return shard.job().configured() ? shard.job().config().total_replicas : 0;
  }

  // Ends the longest-open connection that has not said hello, and gives its
  // place back now (ConnectionPlaces::make_room_before_hello).
  void close_oldest_before_hello() {
    Connection* oldest = nullptr;
    for (Connection& c : connections) {
      if (c.standing != ConnectionPlaces::Standing::kBeforeHello || c.closed_for_room) continue;
      if (oldest == nullptr || c.accepted < oldest->accepted) oldest = &c;
    }
    Handshake* shaking = nullptr;
    for (Handshake& h : handshakes) {  // in the order they were accepted
      if (!h.closed_for_room) {
        shaking = &h;
        break;
      }
    }
    if (shaking != nullptr && (oldest == nullptr || shaking->accepted < oldest->accepted)) {
      log_closed_for_room(shaking->host);
      places.closed(shaking->host, false, ConnectionPlaces::Standing::kBeforeHello);
      shaking->closed_for_room = true;
      shaking->canceler.cancel("closed to make room before its TLS handshake ended");
      return;
    }
    if (oldest == nullptr) return;
    log_closed_for_room(oldest->host);
    places.closed(oldest->host, oldest->local, oldest->standing);
    oldest->closed_for_room = true;
    oldest->stream->abort();
  }

  void log_closed_for_room(const std::string& host) {
    uint64_t suppressed = 0;
    if (log_limiter.allow(host, "closed for room", &suppressed)) {
      spdlog::info(
          "closing a connection from {} that has not said hello: the places not kept for the "
          "job's workers are full, and a new connection needs one{}",
          host, LogLimiter::note(suppressed));
    }
  }

  // Every second: counts the queued replies of connections that are not
  // reading, and hands memory malloc keeps free back to the kernel: once
  // things calm down after a good deal was given back (an attack ended, a
  // large checkpoint was written), or at once if malloc keeps far more free
  // than is in use. Not on every free: a busy psd reuses that memory, warm.
  kj::Promise<void> housekeeping(kj::Timer& timer) {
    return timer.afterDelay(1 * kj::SECONDS).then([this, &timer] {
      for (auto& c : connections) c.account_replies();
      const uint64_t freed = budget.take_freed();
      freed_since_trim += freed;
      const bool calm = freed < kCalmFreedBytes && freed_since_trim >= kTrimAfterFreedBytes;
      if (calm ||
          (freed_since_trim >= kTrimAfterFreedBytes &&
           malloc_free_bytes() > std::max<uint64_t>(kTrimAnywayFreeBytes, 4 * budget.used()))) {
        trim_freed_memory();
        freed_since_trim = 0;
      }
      return housekeeping(timer);
    });
  }

  // Past the connection rules a peer still gets an answer it can show (every
  // call fails with the reason) instead of a bare hang-up; a few such
  // connections at most, beyond that they are just closed.
  void serve_refusal(kj::Own<SocketStream> stream, std::string peer, std::string why) {
    if (refused.size() >= 16) return;
    capnp::ReaderOptions reader;
    reader.traversalLimitInWords = 64 * 1024;
    ConnectionRules rules;
    rules.hello_deadline = 0 * kj::SECONDS;  // closed after a few seconds anyway (below)
    auto it = refused.emplace(refused.end(), kj::mv(stream), shard, std::move(peer), reader,
                              nullptr, std::move(rules), std::move(why));
    it->messages.set_max_message_bytes(kMaxMessageBeforeHello);
    auto drop = [this, it] { refused.erase(it); };
    // (Copies of `drop`: a promise given an lvalue lambda keeps a reference to it.)
    tasks->add(it->network.onDisconnect()
                   .then([drop] { drop(); }, [drop](kj::Exception&&) { drop(); })
                   .exclusiveJoin(io.provider->getTimer().afterDelay(5 * kj::SECONDS).then([drop] {
                     drop();
                   })));
  }

  // serve_refusal under TLS: the refusal goes inside the session (or in
  // the clear to a plaintext client), for a few such connections at once.
  void refuse_tls(kj::Own<SocketStream> socket, std::string peer, std::string why) {
    if (refused.size() + refusing >= 16) return;
    ++refusing;
    tasks->add(secure(kj::mv(socket), peer)
                   .then(
                       [this, peer, why](TlsServer::Accepted a) {
                         serve_refusal(kj::mv(a.stream), peer,
                                       a.plaintext ? kPlaintextRefusal : why);
                       },
                       // secure() logged it, rate-limited: not a line per junk connection.
                       [](kj::Exception&&) {})
                   .attach(kj::defer([this] { --refusing; })));
  }

  // A peer that has not said hello may send only messages this large (a
  // hello carries a token and a few numbers).
  static constexpr uint64_t kMaxMessageBeforeHello = 64u << 10;
  // Requests read from one connection before the loop serves the others.
  static constexpr unsigned kMessagesPerTurn = 16;
  // Calls a peer may have in flight (answered or not, without its Finish),
  // and what capnp holds for each (its answer entry and promises).
  static constexpr uint32_t kMaxUnfinishedCalls = 16384;
  static constexpr uint64_t kBytesPerUnfinishedCall = 1024;
  // A large request gets --request_timeout_secs plus a second per this many bytes.
  static constexpr uint64_t kMinRequestBytesPerSec = 1u << 20;
  static constexpr uint64_t kTrimAfterFreedBytes = 64u << 20;
  static constexpr uint64_t kCalmFreedBytes = 4u << 20;  // given back in a second: calm
  static constexpr uint64_t kTrimAnywayFreeBytes = 1ull << 30;

  ServerOptions options;
  kj::AsyncIoContext& io;
  ComputePool pool;
  BusyPoll busy_poll;
  MemoryBudget budget;  // before everything that counts against it
  LogLimiter log_limiter;
  ConnectionPlaces places;
  uint64_t freed_since_trim = 0;
  Shard shard;
  std::unique_ptr<Checkpointer> checkpointer;
  std::list<Connection> connections;
  std::list<Connection> refused;
  unsigned refusing = 0;           // refusals waiting for their TLS handshake
  // Admitted connections whose TLS handshake is under way, oldest first.
  struct Handshake {
    std::string host;
    uint64_t accepted = 0;
    bool closed_for_room = false;  // its place is already given back
    kj::Canceler canceler;
  };
  std::list<Handshake> handshakes;
  uint64_t accept_count = 0;  // connections admitted so far: their order
  std::unique_ptr<TlsServer> tls;  // --tls_cert: the TCP port speaks TLS
  kj::Own<kj::TaskSet> tasks;
  std::unique_ptr<MonitoringHttp> http;  // with --http_port
};

PsServer::PsServer(ServerOptions options, kj::AsyncIoContext& io)
    : impl_(std::make_unique<Impl>(std::move(options), io)) {}
PsServer::~PsServer() = default;

Shard& PsServer::shard() { return impl_->shard; }

bool PsServer::run(kj::Promise<void> stop) {
  const ServerOptions& o = impl_->options;
  kj::AsyncIoContext& io = impl_->io;
  kj::Own<kj::ConnectionReceiver> tcp, local;
  // Restore before listening: no client ever sees the shard half-loaded.
  if (impl_->checkpointer) {
    try {
      check_checkpoint_dir(o.checkpoint.dir, o.shard.shard_index, o.shard.num_shards);
    } catch (const Error& e) {
      throw ConfigError(std::string("--checkpoint_dir: ") + e.what());
    }
    impl_->checkpointer->restore();
  }
  try {
    auto addr = io.provider->getNetwork()
                    .parseAddress(o.bind, static_cast<uint>(o.port))
                    .wait(io.waitScope);
    tcp = addr->listen();
  } catch (const kj::Exception& e) {
    std::string why = for_people(e.getDescription().cStr());
    const bool from_flags = o.listen_from.empty();
    if (!from_flags) {
      // The port is the cluster's to choose: "pick 0" would not help.
      const auto hint = why.find(" (another process has this port");
      if (hint != std::string::npos) why = why.substr(0, hint) + " (another process has this port)";
    }
    throw ConfigError("psd: cannot listen on " + o.bind + ":" + std::to_string(o.port) + " (" +
                      (from_flags ? std::string("--bind, --port") : o.listen_from) + "): " + why);
  }
  const int port = static_cast<int>(tcp->getPort());
  FileId unix_socket_file;
  if (!o.unix_socket.empty()) {
    claim_unix_socket_path(o.unix_socket);
    try {
      local = io.provider->getNetwork()
                  .parseAddress("unix:" + o.unix_socket)
                  .wait(io.waitScope)
                  ->listen();
    } catch (const kj::Exception& e) {
      throw ConfigError("psd: cannot listen on unix:" + o.unix_socket +
                        " (--unix_socket): " + for_people(e.getDescription().cStr()));
    }
    unix_socket_file = FileId::of(o.unix_socket);
  }
  kj::Own<kj::ConnectionReceiver> http;
  if (o.http_port) {
    try {
      http =
          io.provider->getNetwork().parseAddress(o.bind, *o.http_port).wait(io.waitScope)->listen();
    } catch (const kj::Exception& e) {
      throw ConfigError(fmt::format("psd: cannot listen for HTTP on {}:{} (--http_port): {}",
                                    o.bind, *o.http_port, for_people(e.getDescription().cStr())));
    }
    spdlog::info("psd shard {} serving HTTP (/metrics, /healthz, status page) on {}://{}:{}/",
                 o.shard.shard_index, impl_->tls ? "https" : "http", o.bind, http->getPort());
    // After its log line and before port_file: whoever waits for port_file
    // may read this one, and the log, at once.
    if (!o.http_port_file.empty())
      write_port_file(o.http_port_file, static_cast<int>(http->getPort()), "--http_port_file");
  }
  const int send_buffer_kb = same_host_send_buffer_bytes() >> 10;
  spdlog::info(
      "psd shard {}/{} listening on {}:{}{}{} ({} compute threads, {} for a large table request, "
      "same-host TCP send buffer {}, "
      "memory budget {} MiB (--max_memory_mb))",
      o.shard.shard_index, o.shard.num_shards, o.bind, port,
      impl_->tls ? (o.tls.client_ca.empty() ? " (TLS)" : " (TLS, client certificates required)")
                 : "",
      o.unix_socket.empty() ? "" : " and unix:" + o.unix_socket, o.threads,
      std::min(o.shard.table_threads, o.threads + 1),
      send_buffer_kb > 0 ? std::to_string(send_buffer_kb) + " KiB" : "autotuned",
      impl_->budget.limit() >> 20);
  // After the line above: whoever waits for port_file may read the log at once.
  if (!o.port_file.empty()) write_port_file(o.port_file, port, "--port_file");

  auto serving =
      impl_->accept_loop(*tcp, "tcp").exclusiveJoin(impl_->housekeeping(io.provider->getTimer()));
  if (impl_->checkpointer && o.checkpoint.every_secs > 0) {
    serving = serving.exclusiveJoin(impl_->checkpointer->run_periodic(io.provider->getTimer()));
  }
  serving = serving.exclusiveJoin(
      impl_->shard.watch_workers(io.provider->getTimer()));  // timeouts; waits said in the log
  if (local) serving = serving.exclusiveJoin(impl_->accept_loop(*local, "unix"));
  if (http) {
    // Same event loop as the RPC: the handlers read the shard without locks.
    impl_->http = std::make_unique<MonitoringHttp>(
        impl_->shard, io.provider->getTimer(),
        o.http_auth_token.empty() ? o.shard.auth_token : o.http_auth_token, impl_->tls.get());
    serving = serving.exclusiveJoin(impl_->http->serve(*http));
  }
  if (o.exit_when_done) {
    auto done = kj::newPromiseAndFulfiller<void>();
    impl_->shard.job().on_done([f = done.fulfiller.get()] { f->fulfill(); });
    // Give the last replies time to leave before the connections close.
    stop =
        stop.exclusiveJoin(done.promise
                               .then([&io] {
                                 return io.provider->getTimer().afterDelay(200 * kj::MILLISECONDS);
                               })
                               .then([] { spdlog::info("job done and all workers gone"); }))
            .attach(kj::mv(done.fulfiller));
  }
  serving.exclusiveJoin(kj::mv(stop)).wait(io.waitScope);
  impl_->shard.job().on_done(nullptr);
  // Stop listening at once: a client reconnecting now is refused (and
  // retries) instead of being accepted by a psd about to exit; a probe of
  // the HTTP port is refused too, not left unanswered through the final
  // checkpoint.
  tcp = nullptr;
  local = nullptr;
  http = nullptr;
  // Connections closing now must not complete a sync step with fewer
  // replicas on the way out.
  impl_->shard.job().on_worker_lost(nullptr);

  spdlog::info("psd shard {} stopping: {} connections open, {} tensors", o.shard.shard_index,
               impl_->connections.size(), impl_->shard.store().count());
  // Finish the arithmetic in flight (it reads request buffers) before the
  // connections, and the promises watching them, go away.
  impl_->pool.join();
  impl_->http = nullptr;  // closes the HTTP connections still open
  impl_->tasks = nullptr;
  impl_->refused.clear();
  impl_->connections.clear();
  bool saved = true;
  if (impl_->checkpointer) {
    // The final state, once no request can change it any more, so a restart
    // goes on from exactly here (a push whose reply was lost is retried and
    // recognised by its request id).
    try {
      impl_->checkpointer->checkpoint(-1).wait(io.waitScope);
    } catch (const kj::Exception& e) {
      spdlog::error("final checkpoint failed: {}", e.getDescription().cStr());
      saved = false;
    } catch (const Error& e) {
      spdlog::error("final checkpoint failed: {}", e.what());
      saved = false;
    }
    impl_->shard.set_checkpointer(nullptr);
    impl_->checkpointer = nullptr;
  }
  if (!o.unix_socket.empty() && unix_socket_file != FileId{} &&
      FileId::of(o.unix_socket) == unix_socket_file)
    ::unlink(o.unix_socket.c_str());
  return saved;
}

bool serve_until_signal(const ServerOptions& options) {
  tune_malloc_for_large_messages();
  KjLogThroughSpdlog kj_log;
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  auto io = kj::setupAsyncIo();
  auto stop = io.unixEventPort.onSignal(SIGTERM)
                  .exclusiveJoin(io.unixEventPort.onSignal(SIGINT))
                  .then([](siginfo_t info) {
                    spdlog::info("received signal {}, shutting down", info.si_signo);
                  });
  PsServer server(options, io);
  return server.run(kj::mv(stop));
}

}  // namespace ps
