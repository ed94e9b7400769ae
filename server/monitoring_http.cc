#include "server/accept_retry.h"
#include "server/monitoring_http.h"

#include <chrono>
#include <string>

#include <kj/compat/http.h>
#include <spdlog/spdlog.h>

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

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
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
  void getsockname(struct sockaddr* addr, uint* length) override { inner_->getsockname(addr, length); }
  void getpeername(struct sockaddr* addr, uint* length) override { inner_->getpeername(addr, length); }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
  uint64_t unanswered_ = 0;
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
class BadRequestHandler final : public kj::HttpServerErrorHandler {
 public:
  kj::Promise<void> handleClientProtocolError(kj::HttpHeaders::ProtocolError error,
                                              kj::HttpService::Response& response) override {
    spdlog::info("http: refused a malformed request: {}", error.description.cStr());
    kj::HttpHeaderTable table;
    kj::HttpHeaders headers(table);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; charset=utf-8");
    auto body = kj::str("bad request: ", error.description, "\n");
    auto out = response.send(400, "Bad Request", headers, body.size());
    auto written = out->write(body.begin(), body.size());
    return written.attach(kj::mv(out), kj::mv(body));
  }
};

class LogHttpErrors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override { spdlog::debug("http connection ended: {}", e.getDescription().cStr()); }
};
LogHttpErrors log_http_errors;

// The header table and the ids of the headers psd sets beyond KJ's builtins.
struct Headers {
  kj::HttpHeaderTable::Builder builder;
  kj::HttpHeaderId allow = builder.add("Allow");
  kj::HttpHeaderId cache_control = builder.add("Cache-Control");
  kj::Own<kj::HttpHeaderTable> table = builder.build();
};

}  // namespace

struct MonitoringHttp::Impl final : public kj::HttpService {
  Impl(Shard& shard, kj::Timer& timer)
      : shard(shard),
        timer(timer),
        server(timer, *headers.table, *this, settings()),
        connections(log_http_errors) {}

  kj::HttpServerSettings settings() {
    kj::HttpServerSettings s;
    s.errorHandler = bad_request_handler;
    return s;
  }

  // What HttpServer::listenHttp does, plus the 431 fallback above.
  kj::Promise<void> accept_loop(kj::ConnectionReceiver& listener) {
    // evalNow: a failing accept() throws at once (see server.cc).
    return kj::evalNow([&] { return listener.accept(); }).then([this, &listener](kj::Own<kj::AsyncIoStream> stream) {
      if (open_connections >= kMaxConnections) {
        // Dropped at once: idle visitors must not take every descriptor
        // psd has (its workers' connections need them).
        spdlog::warn("http: refused a connection: {} open (the most psd serves)", open_connections);
        return accept_loop(listener);
      }
      ++open_connections;
      auto tracked = kj::heap<AnswerTrackingStream>(kj::mv(stream));
      AnswerTrackingStream& conn = *tracked;
      connections.add(server.listenHttpCleanDrain(conn)
                          .then([this, &conn](bool) -> kj::Promise<void> {
                            if (conn.unanswered_bytes() < kOversizedHeadBytes) return kj::READY_NOW;
                            spdlog::info("http: refused a request with a head over 128 KiB (431)");
                            return conn.write(kHeadTooLarge.begin(), kHeadTooLarge.size()).then([this, &conn] {
                              return drain_then_close(conn);
                            });
                          })
                          .attach(kj::mv(tracked), kj::defer([this] { --open_connections; })));
      return accept_loop(listener);
    }, [this, &listener](kj::Exception&& e) {
      log_accept_failure("http", e);  // accept_retry.h
      return timer.afterDelay(kAcceptRetry).then([this, &listener] { return accept_loop(listener); });
    });
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

  static kj::Promise<void> discard(AnswerTrackingStream& conn, kj::ArrayPtr<kj::byte> buffer, uint64_t budget) {
    return conn.tryRead(buffer.begin(), 1, buffer.size()).then([&conn, buffer, budget](size_t n) -> kj::Promise<void> {
      if (n == 0 || n >= budget) return kj::READY_NOW;
      return discard(conn, buffer, budget - n);
    });
  }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders&,
                            kj::AsyncInputStream&, Response& response) override {
    if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD) {
      kj::HttpHeaders h(*headers.table);
      h.set(headers.allow, "GET, HEAD");
      return response.sendError(405, "Method Not Allowed", h);
    }
    std::string path(url.cStr());
    path = path.substr(0, path.find_first_of("?#"));
    if (path == "/metrics") return send(response, kPrometheusContentType, prometheus_text(shard, unix_now()));
    if (path == "/healthz") return send(response, "text/plain; charset=utf-8", "ok\n");
    if (path == "/status.json") {
      return send(response, "application/json", status_json(shard, history, unix_now()));
    }
    if (path == "/" || path == "/index.html") {
      return send(response, "text/html; charset=utf-8",
                  std::string(reinterpret_cast<const char*>(kStatusHtml), sizeof(kStatusHtml)));
    }
    return send(response, "text/plain; charset=utf-8", "not found: try /, /metrics, /healthz or /status.json\n", 404,
                "Not Found");
  }

  kj::Promise<void> send(Response& response, const char* content_type, std::string body, unsigned status = 200,
                         const char* status_text = "OK") {
    kj::HttpHeaders h(*headers.table);
    h.set(kj::HttpHeaderId::CONTENT_TYPE, content_type);
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
  // HTTP connections open now, and the most served at once.
  static constexpr int kMaxConnections = 64;
  int open_connections = 0;
  ProgressHistory history;
  Headers headers;
  BadRequestHandler bad_request_handler;
  kj::HttpServer server;
  kj::TaskSet connections;  // last: cancelled first, while the server still exists
};

MonitoringHttp::MonitoringHttp(Shard& shard, kj::Timer& timer) : impl_(std::make_unique<Impl>(shard, timer)) {}
MonitoringHttp::~MonitoringHttp() = default;

kj::Promise<void> MonitoringHttp::serve(kj::ConnectionReceiver& listener) {
  return impl_->accept_loop(listener).exclusiveJoin(impl_->sample_every_second());
}

}  // namespace ps
