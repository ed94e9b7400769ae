// psd's HTTP side: KJ's HTTP server on the same event loop as the RPC, so
// handlers read the shard's state without locks. Serves
//   /metrics      Prometheus text format 0.0.4
//   /healthz      200 "ok"
//   /             the status page (server/www/status.html, embedded at build time)
//   /status.json  what the status page polls every second
// GET and HEAD only (405 otherwise), 404 for other paths; malformed requests
// get KJ's 400 and oversized headers a 431, and the daemon serves on.
//
// With a token, every path but /healthz needs "Authorization: Bearer
// <token>" (401 otherwise): the pages show tensor names, the job and the
// workers' addresses. A request with "Connection: close" is answered and
// its connection closed. Slow peers cannot keep the page from others: a
// request must arrive whole within kRequestDeadline of the connection (or
// of its first byte, when pipelined), and when kMaxConnections are open a
// new one closes the oldest connection of the peer address holding most.
//
// Example (inside PsServer::run):
//   MonitoringHttp http(shard, io.provider->getTimer(), /*bearer_token=*/"");
//   auto serving = http.serve(*listener);   // never resolves; drop to stop
#pragma once

#include <memory>
#include <string>

#include <kj/async-io.h>
#include <kj/timer.h>

#include "server/shard.h"

namespace ps {
class TlsServer;  // common/net/tls.h
}

namespace ps {

class MonitoringHttp {
 public:
  // `bearer_token` empty: no authentication. With `tls` (psd --tls_cert),
  // HTTPS only; it must outlive this.
  MonitoringHttp(Shard& shard, kj::Timer& timer, std::string bearer_token,
                 TlsServer* tls = nullptr);

  static constexpr kj::Duration kRequestDeadline = 3 * kj::SECONDS;
  static constexpr int kMaxConnections = 64;
  ~MonitoringHttp();
  MonitoringHttp(const MonitoringHttp&) = delete;
  MonitoringHttp& operator=(const MonitoringHttp&) = delete;

  // Accepts HTTP connections on `listener` and records the progress history
  // (one sample a second) until the promise is dropped.
  kj::Promise<void> serve(kj::ConnectionReceiver& listener);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps
