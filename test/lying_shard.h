// A fake psd shard for tests of what libpsclient does with replies it must
// not trust (a psd of another version, a broken one, anything else on a ps
// host's port). It listens on 127.0.0.1 (a free port), answers hello as a
// one-shard psd would, and each other call it is given a handler for as the
// handler writes the results: well-formed Cap'n Proto, wrong in one way.
// A call without a handler fails as unimplemented. A handler that throws
// DISCONNECTED plays a psd killed mid-call: the client reconnects and says
// hello again, so the hello handler can play the psd that restarted.
//
//   LyingShard shard({.push = [](auto, auto results) { results.initStatus(0); }});
//   ps::Client client(shard.options());
#pragma once

#include <functional>
#include <future>
#include <string>
#include <thread>

#include <capnp/ez-rpc.h>
#include <kj/async.h>

#include "ps/client.h"
#include "schema/ps.capnp.h"

namespace ps::test {

class LyingShard {
 public:
  // Each runs on the shard's thread with the call's params and results;
  // every member has a default initialiser (designated initialisers name one).
  struct Lies {
    std::function<void(wire::ShardInfo::Builder)> hello{};  // on top of an honest info
    std::function<void(wire::Shard::PullParams::Reader, wire::Shard::PullResults::Builder)> pull{};
    std::function<void(wire::Shard::PushParams::Reader, wire::Shard::PushResults::Builder)> push{};
    std::function<void(wire::Shard::PullRowsParams::Reader, wire::Shard::PullRowsResults::Builder)>
        pull_rows{};
    std::function<void(wire::Shard::PushRowsParams::Reader, wire::Shard::PushRowsResults::Builder)>
        push_rows{};
    std::function<void(wire::Shard::StepDoneParams::Reader, wire::Shard::StepDoneResults::Builder)>
        step_done{};
    std::function<void(wire::Shard::ListResults::Builder)> list{};
    std::function<void(wire::Shard::StatsResults::Builder)> stats{};
    std::function<void(wire::Shard::ListTablesResults::Builder)> list_tables{};
  };

  explicit LyingShard(Lies lies) : lies_(std::move(lies)) {
    std::promise<Started> started;
    auto ready = started.get_future();
    thread_ = std::thread([this, &started] {
      capnp::EzRpcServer server(kj::heap<Service>(lies_), "127.0.0.1", 0);
      auto& ws = server.getWaitScope();
      auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
      started.set_value({server.getPort().wait(ws), kj::mv(stop.fulfiller)});
      stop.promise.wait(ws);
    });
    Started s = ready.get();
    port_ = s.port;
    stop_ = kj::mv(s.stop);
  }

  ~LyingShard() {
    stop_->fulfill();
    thread_.join();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // A client of this one shard whose waits are bounded: a call the client
  // does not end itself fails within seconds rather than hanging the test.
  ClientOptions options() const {
    ClientOptions o;
    o.ps_hosts = {address()};
    o.prefer_unix_socket = false;
    o.connect_timeout = std::chrono::milliseconds(5000);
    o.call_timeout = std::chrono::milliseconds(15000);
    o.reconnect_timeout = std::chrono::milliseconds(0);
    return o;
  }

 private:
  struct Started {
    unsigned port = 0;
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop;
  };

  class Service final : public wire::Shard::Server {
   public:
    explicit Service(const Lies& lies) : lies_(lies) {}

    kj::Promise<void> hello(HelloContext context) override {
      auto info = context.getResults().initInfo();
      info.setProtocolVersion(wire::K_PROTOCOL_VERSION);
      info.setShardIndex(0);
      info.setNumShards(1);
      info.setServerVersion("lying shard");
      info.setMaxMessageBytes(64u << 20);
      info.setHostId("not-this-host");
      info.setInstanceId(1);
      info.initJob();
      if (lies_.hello) lies_.hello(info);
      return kj::READY_NOW;
    }
    kj::Promise<void> pull(PullContext context) override { return answer(lies_.pull, context); }
    kj::Promise<void> push(PushContext context) override { return answer(lies_.push, context); }
    kj::Promise<void> pullRows(PullRowsContext context) override {
      return answer(lies_.pull_rows, context);
    }
    kj::Promise<void> pushRows(PushRowsContext context) override {
      return answer(lies_.push_rows, context);
    }
    kj::Promise<void> stepDone(StepDoneContext context) override {
      return answer(lies_.step_done, context);
    }
    kj::Promise<void> list(ListContext context) override {
      return answer_results(lies_.list, context);
    }
    kj::Promise<void> stats(StatsContext context) override {
      return answer_results(lies_.stats, context);
    }
    kj::Promise<void> listTables(ListTablesContext context) override {
      return answer_results(lies_.list_tables, context);
    }

   private:
    template <typename Handler, typename Context>
    static kj::Promise<void> answer(const Handler& handler, Context& context) {
      KJ_REQUIRE(handler != nullptr, "the lying shard has no handler for this call");
      handler(context.getParams(), context.getResults());
      return kj::READY_NOW;
    }
    template <typename Handler, typename Context>
    static kj::Promise<void> answer_results(const Handler& handler, Context& context) {
      KJ_REQUIRE(handler != nullptr, "the lying shard has no handler for this call");
      handler(context.getResults());
      return kj::READY_NOW;
    }
    const Lies& lies_;
  };

  Lies lies_;
  std::thread thread_;
  unsigned port_ = 0;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
};

}  // namespace ps::test
