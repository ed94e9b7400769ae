#include "server/accept_retry.h"
#include "server/monitoring_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <list>
#include <map>
#include <string>

#include <kj/compat/http.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "common/net/tls.h"
#include "server/log_limiter.h"
#include "server/progress_history.h"
#include "server/prometheus_metrics.h"
#include "server/status_html.h"  // generated from server/www/status.html
#include "server/status_json.h"

namespace ps {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// KJ 0.9's HttpServer drops a connection whose request head outgrows its
// 128 KiB buffer without answering (it only logs). To give such a client a
// clear 431, each connection's stream is wrapped to count the bytes read
// since psd last wrote: when KJ gives up on a connection with a large unanswered
// read, that can only be an oversized head (psd answers every request before
// reading any body, and KJ drains at most 64 KiB of body after an answer).
// Newer KJ answers by itself: then a write resets the count and this stays idle.
class AnswerTrackingStream final : public kj::AsyncIoStream {
 public:
  explicit AnswerTrackingStream(kj::Own<kj::AsyncIoStream> inner) : inner_(kj::mv(inner)) {}

  uint64_t unanswered_bytes() const { return unanswered_; }

  // After the answer to a request that asked for "Connection: close": the
  // peer sees the end of the stream now, and KJ's next read finds it too
  // (KJ 0.9 only adds the header, then waits for another request).
  void end_after_answer() {
    ended_ = true;
    inner_->shutdownWrite();
  }

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    if (ended_) return size_t{0};
    return inner_->tryRead(buffer, min_bytes, max_bytes).then([this](size_t n) {
      unanswered_ += n;
      return n;
    });
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    unanswered_ = 0;
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    unanswered_ = 0;
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, uint* length) override {
    inner_->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, uint* length) override {
    inner_->getpeername(addr, length);
  }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
  uint64_t unanswered_ = 0;
  bool ended_ = false;
};

// More unanswered input than this when KJ lets go of a connection: an oversized head.
constexpr uint64_t kOversizedHeadBytes = 96u << 10;

constexpr kj::StringPtr kHeadTooLarge =
    "HTTP/1.1 431 Request Header Fields Too Large\r\n"
    "Connection: close\r\n"
    "Content-Type: text/plain; charset=utf-8\r\n"
    "Content-Length: 40\r\n"
    "\r\n"
    "request line and headers exceed 128 KiB\n"_kj;

// KJ suggests 501 for a method it cannot parse; psd answers any request it
// cannot read with 400 (a method KJ knows but psd does not serve gets 405).
// Its log line is rate-limited (KJ does not say which peer sent it).
class BadRequestHandler final : public kj::HttpServerErrorHandler {
 public:
  explicit BadRequestHandler(LogLimiter& limiter) : limiter_(limiter) {}
  kj::Promise<void> handleClientProtocolError(kj::HttpHeaders::ProtocolError error,
                                              kj::HttpService::Response& response) override {
    uint64_t suppressed = 0;
    if (limiter_.allow("http", "malformed", &suppressed)) {
      spdlog::info("http: refused a malformed request: {}{}", error.description.cStr(),
                   LogLimiter::note(suppressed));
    }
    kj::HttpHeaderTable table;
    kj::HttpHeaders headers(table);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; charset=utf-8");
    auto body = kj::str("bad request: ", error.description, "\n");
    auto out = response.send(400, "Bad Request", headers, body.size());
    auto written = out->write(body.begin(), body.size());
    return written.attach(kj::mv(out), kj::mv(body));
  }

 private:
  LogLimiter& limiter_;
};

class LogHttpErrors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override {
    spdlog::debug("http connection ended: {}", e.getDescription().cStr());
  }
};
LogHttpErrors log_http_errors;

// The header table and the ids of the headers psd sets beyond KJ's builtins.
struct Headers {
  kj::HttpHeaderTable::Builder builder;
  kj::HttpHeaderId allow = builder.add("Allow");
  kj::HttpHeaderId cache_control = builder.add("Cache-Control");
  kj::HttpHeaderId authorization = builder.add("Authorization");
  kj::HttpHeaderId www_authenticate = builder.add("WWW-Authenticate");
  kj::HttpHeaderId allow_origin = builder.add("Access-Control-Allow-Origin");
  kj::Own<kj::HttpHeaderTable> table = builder.build();
};

// Whether a Connection header's comma-separated options include "close".
bool asks_to_close(kj::Maybe<kj::StringPtr> header) {
  KJ_IF_MAYBE (value, header) {
    std::string v(value->cStr());
    std::size_t start = 0;
    while (start <= v.size()) {
      std::size_t end = v.find(',', start);
      if (end == std::string::npos) end = v.size();
      std::string token = v.substr(start, end - start);
      const auto first = token.find_first_not_of(" \t"), last = token.find_last_not_of(" \t");
      token = first == std::string::npos ? "" : token.substr(first, last - first + 1);
      if (token.size() == 5 && strncasecmp(token.c_str(), "close", 5) == 0) return true;
      start = end + 1;
    }
  }
  return false;
}

// Compares all of `want` whatever `got` holds (no early exit on a mismatch).
bool same_secret(kj::StringPtr got, const std::string& want) {
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const unsigned char g = i < got.size() ? static_cast<unsigned char>(got[i]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(want[i]));
  }
  return diff == 0;
}

std::string peer_host(kj::AsyncIoStream& stream) {
  sockaddr_storage addr{};
  uint len = sizeof(addr);
  try {
    stream.getpeername(reinterpret_cast<sockaddr*>(&addr), &len);
  } catch (...) {
    return "?";
  }
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

struct MonitoringHttp::Impl final : public kj::HttpService, public kj::HttpServerCallbacks {
  // The service as one connection sees it: Impl's, and the connection
  // ended once a request that asked for it is answered.
  struct ConnService final : public kj::HttpService {
    ConnService(Impl& impl, AnswerTrackingStream& stream) : impl(impl), stream(stream) {}
    kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                              const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                              Response& response) override {
      const bool close = asks_to_close(headers.get(kj::HttpHeaderId::CONNECTION));
      return impl.request(method, url, headers, body, response).then([this, close] {
        if (close) stream.end_after_answer();
      });
    }
    Impl& impl;
    AnswerTrackingStream& stream;
  };

  Impl(Shard& shard, kj::Timer& timer, std::string bearer_token, TlsServer* tls)
      : shard(shard),
        timer(timer),
        tls(tls),
        token(std::move(bearer_token)),
        server(timer, *headers.table,
               kj::HttpServer::HttpServiceFactory([this](kj::AsyncIoStream& stream) {
                 // The stream is the AnswerTrackingStream accept_loop hands to the server.
                 auto& tracked = static_cast<AnswerTrackingStream&>(stream);
                 return kj::Own<kj::HttpService>(kj::heap<ConnService>(*this, tracked));
               }),
               settings()),
        connections(log_http_errors) {}

  kj::HttpServerSettings settings() {
    kj::HttpServerSettings s;
    s.errorHandler = bad_request_handler;
    s.callbacks = *this;
    // A request arrives whole within this, or its connection is closed: a
    // peer sending a byte now and then holds a place only that long.
    s.headerTimeout = kRequestDeadline;
    s.pipelineTimeout = kRequestDeadline;
    return s;
  }

  // A place among kMaxConnections: an open HTTP connection or a TLS
  // handshake for one; cancelling it closes it.
  struct Place {
    explicit Place(std::string p) : peer(std::move(p)) {}
    virtual ~Place() = default;
    std::string peer;
    kj::Canceler canceler;
    bool evicted = false;
  };
  struct Conn : Place {
    explicit Conn(kj::Own<AnswerTrackingStream> s) : Place(peer_host(*s)), stream(kj::mv(s)) {}
    kj::Own<AnswerTrackingStream> stream;
  };

  // Takes a place for `place` (closing another when all are taken) while
  // `work` runs; eviction cancels `work`.
  template <typename T>
  kj::Promise<T> hold(kj::Own<Place> place, kj::Promise<T> work) {
    const auto live =
        std::count_if(open.begin(), open.end(), [](const Place* c) { return !c->evicted; });
    if (live >= kMaxConnections) evict_one();
    Place* p = place.get();
    open.push_back(p);
    auto it = std::prev(open.end());
    // The wrapped promise goes before `place` (attachments outlive it).
    return p->canceler.wrap(kj::mv(work))
        .attach(kj::defer([this, it] { open.erase(it); }), kj::mv(place));
  }

  // Closes the oldest connection of the peer address holding the most, to
  // make room for a new one: a flood from one address only displaces
  // itself, and a newcomer is always served.
  void evict_one() {
    std::map<std::string, int> per_peer;
    for (Place* c : open) per_peer[c->peer] += !c->evicted;
    Place* victim = nullptr;
    for (Place* c : open) {  // oldest first
      if (c->evicted) continue;
      if (victim == nullptr || per_peer[c->peer] > per_peer[victim->peer]) victim = c;
    }
    if (victim == nullptr) return;
    uint64_t suppressed = 0;
    if (log_limiter.allow(victim->peer, "evicted", &suppressed)) {
      spdlog::info(
          "http: {} connections open (the most psd serves): closing the oldest of {} ({} open){}",
          open.size(), victim->peer, per_peer[victim->peer], LogLimiter::note(suppressed));
    }
    victim->evicted = true;
    victim->canceler.cancel("closed for a newer connection");
  }

  // What HttpServer::listenHttp does, plus the 431 fallback above.
  kj::Promise<void> accept_loop(kj::ConnectionReceiver& listener) {
    // evalNow: a failing accept() throws at once (see server.cc).
    return kj::evalNow([&] { return listener.accept(); })
        .then(
            [this, &listener](kj::Own<kj::AsyncIoStream> stream) {
              if (tls != nullptr) {
                // HTTPS: served once the handshake is done, within the request
                // deadline; a handshake holds a place like a connection.
                auto place = kj::heap<Place>(peer_host(*stream));
                auto shaken =
                    tls->accept_stream(kj::mv(stream))
                        .exclusiveJoin(timer.afterDelay(kRequestDeadline)
                                           .then([]() -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
                                             return KJ_EXCEPTION(DISCONNECTED,
                                                                 "no TLS handshake in time");
                                           }));
                connections.add(hold(kj::mv(place), kj::mv(shaken))
                                    .then([this](kj::Own<kj::AsyncIoStream> session) {
                                      serve(kj::mv(session));
                                    }));
              } else {
                serve(kj::mv(stream));
              }
              return accept_loop(listener);
            },
            [this, &listener](kj::Exception&& e) {
              log_accept_failure("http", e);  // accept_retry.h
              return timer.afterDelay(kAcceptRetry).then([this, &listener] {
                return accept_loop(listener);
              });
            });
  }

  void serve(kj::Own<kj::AsyncIoStream> stream) {
    auto conn = kj::heap<Conn>(kj::heap<AnswerTrackingStream>(kj::mv(stream)));
    AnswerTrackingStream& stream_ref = *conn->stream;
    auto served = server.listenHttpCleanDrain(stream_ref)
                      .then([this, &stream_ref, peer = conn->peer](bool) -> kj::Promise<void> {
                        if (stream_ref.unanswered_bytes() < kOversizedHeadBytes)
                          return kj::READY_NOW;
                        uint64_t suppressed = 0;
                        if (log_limiter.allow(peer, "431", &suppressed)) {
                          spdlog::info(
                              "http: refused a request from {} with a head over 128 KiB (431){}",
                              peer, LogLimiter::note(suppressed));
                        }
                        return stream_ref.write(kHeadTooLarge.begin(), kHeadTooLarge.size())
                            .then([this, &stream_ref] { return drain_then_close(stream_ref); });
                      });
    connections.add(hold<void>(kj::mv(conn), kj::mv(served)));
  }

  // kj::HttpServerCallbacks: asked as each response starts. Closes after
  // it when the request said "Connection: close", and sheds keep-alive
  // connections when half the places are taken.
  bool shouldClose() override {
    const bool close =
        close_this_response || open.size() > static_cast<std::size_t>(kMaxConnections / 2);
    close_this_response = false;
    return close;
  }

  // Closing with unread input makes the kernel send a reset, which can
  // destroy the answer before the client reads it: half-close, then read and
  // discard what the client still sends (bounded in bytes and time).
  kj::Promise<void> drain_then_close(AnswerTrackingStream& conn) {
    conn.shutdownWrite();
    auto buffer = kj::heapArray<kj::byte>(64u << 10);
    auto drain = discard(conn, buffer, 16u << 20);
    return drain.attach(kj::mv(buffer)).exclusiveJoin(timer.afterDelay(2 * kj::SECONDS));
  }

  static kj::Promise<void> discard(AnswerTrackingStream& conn, kj::ArrayPtr<kj::byte> buffer,
                                   uint64_t budget) {
    return conn.tryRead(buffer.begin(), 1, buffer.size())
        .then([&conn, buffer, budget](size_t n) -> kj::Promise<void> {
          if (n == 0 || n >= budget) return kj::READY_NOW;
          return discard(conn, buffer, budget - n);
        });
  }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& request_headers, kj::AsyncInputStream&,
                            Response& response) override {
    close_this_response = asks_to_close(request_headers.get(kj::HttpHeaderId::CONNECTION));
    if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD) {
      kj::HttpHeaders h(*headers.table);
      h.set(headers.allow, "GET, HEAD");
      return response.sendError(405, "Method Not Allowed", h);
    }
    std::string path(url.cStr());
    path = path.substr(0, path.find_first_of("?#"));
    if (path != "/healthz" && !authorized(request_headers)) {
      kj::HttpHeaders h(*headers.table);
      h.set(headers.www_authenticate, "Bearer realm=\"psd\"");
      h.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; charset=utf-8");
      constexpr kj::StringPtr body =
          "psd wants \"Authorization: Bearer <token>\" (its --http_auth_token_file, or "
          "else --auth_token_file)\n"_kj;
      auto out = response.send(401, "Unauthorized", h, body.size());
      auto written = out->write(body.begin(), body.size());
      return written.attach(kj::mv(out));
    }
    if (path == "/metrics")
      return send(response, kPrometheusContentType, prometheus_text(shard, unix_now()));
    if (path == "/healthz") return send(response, "text/plain; charset=utf-8", "ok\n");
    if (path == "/status.json") {
      // Any page may read it when anyone may (no token): so psd 0's page can show every shard
      // (its ?shards= list) without psd fetching from its peers. With a token, same origin only.
      return send(response, "application/json", status_json(shard, history, unix_now()), 200, "OK",
                  token.empty());
    }
    if (path == "/" || path == "/index.html") {
      return send(response, "text/html; charset=utf-8",
                  std::string(reinterpret_cast<const char*>(kStatusHtml), sizeof(kStatusHtml)));
    }
    return send(response, "text/plain; charset=utf-8",
                "not found: try /, /metrics, /healthz or /status.json\n", 404, "Not Found");
  }

  bool authorized(const kj::HttpHeaders& h) const {
    if (token.empty()) return true;
    KJ_IF_MAYBE (value, h.get(headers.authorization)) {
      constexpr kj::StringPtr kBearer = "Bearer "_kj;
      if (value->size() >= kBearer.size() &&
          strncasecmp(value->cStr(), kBearer.cStr(), kBearer.size()) == 0) {
        return same_secret(value->slice(kBearer.size()), token);
      }
    }
    return false;
  }

  kj::Promise<void> send(Response& response, const char* content_type, std::string body,
                         unsigned status = 200, const char* status_text = "OK",
                         bool any_origin = false) {
    kj::HttpHeaders h(*headers.table);
    h.set(kj::HttpHeaderId::CONTENT_TYPE, content_type);
    if (any_origin) h.set(headers.allow_origin, "*");
    h.set(headers.cache_control, "no-store");  // live values: never serve them from a cache
    auto out = response.send(status, status_text, h, body.size());
    auto text = kj::heap<std::string>(std::move(body));
    auto written = out->write(text->data(), text->size());
    return written.attach(kj::mv(out), kj::mv(text));
  }

  kj::Promise<void> sample_every_second() {
    history.add(sample_progress(shard, unix_now()));
    return timer.afterDelay(1 * kj::SECONDS).then([this] { return sample_every_second(); });
  }

  Shard& shard;
  kj::Timer& timer;
  TlsServer* tls;           // null: plain HTTP
  const std::string token;  // empty: no authentication
  std::list<Place*> open;   // oldest first
  bool close_this_response = false;
  ProgressHistory history;
  Headers headers;
  LogLimiter log_limiter;  // lines a peer's requests cause: a few per interval, not one each
  BadRequestHandler bad_request_handler{log_limiter};
  kj::HttpServer server;
  kj::TaskSet connections;  // last: cancelled first, while the server still exists
};

MonitoringHttp::MonitoringHttp(Shard& shard, kj::Timer& timer, std::string bearer_token,
                               TlsServer* tls)
    : impl_(std::make_unique<Impl>(shard, timer, std::move(bearer_token), tls)) {}
MonitoringHttp::~MonitoringHttp() = default;

kj::Promise<void> MonitoringHttp::serve(kj::ConnectionReceiver& listener) {
  return impl_->accept_loop(listener).exclusiveJoin(impl_->sample_every_second());
}

}  // namespace ps
