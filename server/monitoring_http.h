// psd's HTTP side: KJ's HTTP server on the same event loop as the RPC, so
// handlers read the shard's state without locks. Serves
//   /metrics      Prometheus text format 0.0.4
//   /healthz      200 "ok"
//   /             the status page (server/www/status.html, embedded at build time)
//   /status.json  what the status page polls every second
// GET and HEAD only (405 otherwise), 404 for other paths; malformed requests
// get KJ's 400 and oversized headers a 431, and the daemon serves on.
//
// Example (inside PsServer::run):
//   MonitoringHttp http(shard, io.provider->getTimer());
//   auto serving = http.serve(*listener);   // never resolves; drop to stop
#pragma once

#include <memory>

#include <kj/async-io.h>
#include <kj/timer.h>

#include "server/shard.h"

namespace ps {

class MonitoringHttp {
 public:
  MonitoringHttp(Shard& shard, kj::Timer& timer);
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
