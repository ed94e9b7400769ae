// psclient.Client: a ps::Client with what Python adds to it: closing (also
// at interpreter exit), the async calls' completer, and the shapes of the
// tensors it placed and the tables it created or declared, so that arrays
// of the wrong size are refused before anything is sent and pull(name) /
// pull_rows(table, ids) can make an array of the right shape.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "ps/client.h"
#include "client/trainer/wait_watcher.h"
#include "ps/embedding.h"
#include "python/src/async_calls.h"

namespace psclient_py {

namespace py = pybind11;

// A duration in seconds from Python; ValueError (naming `what`) unless
// 0 <= seconds <= 1e9.
std::chrono::milliseconds to_ms(double seconds, const char* what);

class PyClient {
 public:
  explicit PyClient(ps::ClientOptions options);  // connects; call with the GIL released
  ~PyClient();                                   // close(OnCtrlC::kStopWaiting); GIL held
  PyClient(const PyClient&) = delete;
  PyClient& operator=(const PyClient&) = delete;

  // The connection; ValueError once closed. Shared with TrainingSessions,
  // which keep it open until they go.
  ps::Client& client();
  std::shared_ptr<ps::Client> shared_client();
  // Completes pending async calls, then closes the connections. Idempotent.
  // What Ctrl-C (on the main thread) does to that wait:
  //  - kRaise (close()): stops it; the connections close, which fails the
  //    calls still under way, and KeyboardInterrupt is raised once their
  //    futures are set;
  //  - kStopWaiting (a Client dropped, where nothing may be raised): stops
  //    it, the connections close, and the Ctrl-C stays pending for Python;
  //  - kIgnore (at exit: no completing thread may outlive the interpreter).
  enum class OnCtrlC { kRaise, kStopWaiting, kIgnore };
  void close(OnCtrlC on_ctrl_c = OnCtrlC::kRaise);
  bool closed() const { return client_ == nullptr; }

  // The shape of `name` as created or declared on this Client (also by a
  // TrainingSession); nullptr if it is neither.
  const std::vector<uint64_t>* shape_of(const std::string& name);

  // The spec of table `name` as created or declared on this Client;
  // nullptr if it is neither.
  const ps::TableSpec* table_of(const std::string& name) const;
  void remember_tables(const std::vector<ps::TableSpec>& tables);

  AsyncCalls& async_calls() { return async_calls_; }
  // For a WaitWatcher::Scope around a call that may wait long (taken with
  // the GIL held, kept while the call lasts); nullptr once closed.
  std::shared_ptr<ps::WaitWatcher> watcher() const { return watch_; }

 private:
  std::shared_ptr<ps::Client> client_;
  std::shared_ptr<ps::WaitWatcher> watch_;  // over *client_; goes before it
  std::map<std::string, std::vector<uint64_t>> shapes_;
  std::map<std::string, ps::TableSpec> tables_;
  AsyncCalls async_calls_;
};

}  // namespace psclient_py
