// Authentication (--auth_token_file) and per-client limits against a real
// psd: refused peers get a clear error and nothing else; psd serves on.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <fstream>
#include <thread>

#include <capnp/ez-rpc.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include "test/http_test_util.h"
#include "schema/ps.capnp.h"
#include "ps/client.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;
using ps::test::TempDir;
using namespace std::chrono_literals;

namespace {

ClientOptions options_for(const PsdProcess& psd) {
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.connect_timeout = 2s;
  return o;
}

// A client, once psd lets one in: psd sees a closed connection (freeing a
// place) a moment after the peer closes it. Null after `tries`.
std::unique_ptr<Client> client_when_let_in(const PsdProcess& psd, int tries,
                                           std::chrono::milliseconds pause) {
  for (int i = 0; i < tries; ++i) {
    try {
      return std::make_unique<Client>(options_for(psd));
    } catch (const ConnectionError&) {
      std::this_thread::sleep_for(pause);
    }
  }
  return nullptr;
}

std::string token_file(const TempDir& dir, const std::string& token) {
  const std::string path = dir.path() + "/token";
  std::ofstream(path) << token << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

}  // namespace

TEST_CASE("with --auth_token_file, only a hello with the token opens a connection") {
  TempDir dir;
  PsdProcess psd({"--auth_token_file", token_file(dir, "s3cret-token")});

  SECTION("no token, or a wrong one: refused, logged with the peer's address") {
    ClientOptions o = options_for(psd);
    CHECK_THROWS_WITH(Client(o), Catch::Contains("authentication failed: no token given"));
    o.auth_token = "s3cret-tokeN";
    CHECK_THROWS_WITH(
        Client(o), Catch::Contains("authentication failed: the token given does not match psd's"));
    o.auth_token = "s3cret-token-and-more";
    CHECK_THROWS_AS(Client(o), ConnectionError);
    CHECK_THAT(psd.log(), Catch::Contains("refused hello from 127.0.0.1:") &&
                              Catch::Contains("wrong auth token"));
  }
  SECTION("every call before a successful hello is refused") {
    capnp::EzRpcClient rpc(psd.address());
    auto shard = rpc.getMain<wire::Shard>();
    auto& ws = rpc.getWaitScope();
    CHECK_THROWS_WITH(shard.listRequest().send().wait(ws), Catch::Contains("say hello first"));
    CHECK_THROWS_WITH(shard.statsRequest().send().wait(ws), Catch::Contains("say hello first"));
    auto create = shard.createRequest();
    create.initSpecs(1)[0].setName("x");
    CHECK_THROWS_WITH(create.send().wait(ws), Catch::Contains("say hello first"));
    auto hello = shard.helloRequest();
    hello.setProtocolVersion(wire::K_PROTOCOL_VERSION);
    hello.setWorkerIndex(-1);
    hello.setAuthToken(kj::StringPtr("wrong").asBytes());
    CHECK_THROWS_WITH(hello.send().wait(ws), Catch::Contains("authentication failed"));
    CHECK_THROWS_WITH(shard.listRequest().send().wait(ws), Catch::Contains("say hello first"));
  }
  SECTION("the right token (from a file) works") {
    ClientOptions o = options_for(psd);
    o.auth_token_file = dir.path() + "/token";
    Client client(o);
    client.create({{.name = "w", .shape = {2}, .init = InitConfig::constant(3)}});
    CHECK(client.pull("w") == std::vector<float>{3, 3});
  }
  CHECK(psd.alive());
}

TEST_CASE("--max_tensors_per_client is counted per connection") {
  PsdProcess psd({"--max_tensors_per_client", "2"});
  Client a(options_for(psd));
  CHECK_THROWS_WITH(
      a.create({{.name = "a1", .shape = {1}},
                {.name = "a2", .shape = {1}},
                {.name = "a3", .shape = {1}}}),
      Catch::Contains("at most 2 tensors") && Catch::Contains("--max_tensors_per_client"));
  a.create({{.name = "a1", .shape = {1}}, {.name = "a2", .shape = {1}}});
  a.create({{.name = "a1", .shape = {1}}});  // existing: not counted again
  CHECK_THROWS_AS(a.create({{.name = "a3", .shape = {1}}}), RequestError);
  Client b(options_for(psd));
  b.create({{.name = "b1", .shape = {1}}, {.name = "b2", .shape = {1}}});
  CHECK(b.stats()[0].tensors == 4);
  CHECK(psd.alive());
}

TEST_CASE("--max_connections refuses more connections with a clear error and serves on") {
  PsdProcess psd({"--max_connections", "2"});
  auto a = std::make_unique<Client>(options_for(psd));
  Client b(options_for(psd));
  CHECK_THROWS_WITH(Client(options_for(psd)), Catch::Contains("maximum of 2 connections"));
  b.create({{.name = "x", .shape = {1}}});
  a.reset();
  auto c = client_when_let_in(psd, 100, 20ms);
  REQUIRE(c);
  c->declare({{.name = "x", .shape = {1}}});
  CHECK(c->pull("x") == std::vector<float>{0});
}

namespace {

// A TCP connection to 127.0.0.1:port that sends nothing.
struct IdleConnection {
  explicit IdleConnection(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~IdleConnection() { ::close(fd); }
  int fd = -1;
  bool connected = false;
};

}  // namespace

TEST_CASE("connections that never say hello do not keep --max_connections' places") {
  PsdProcess psd({"--max_connections", "2"});
  IdleConnection idle1(psd.port()), idle2(psd.port());
  REQUIRE((idle1.connected && idle2.connected));
  std::this_thread::sleep_for(200ms);
  CHECK_THROWS_WITH(Client(options_for(psd)), Catch::Contains("maximum of 2 connections"));
  // Closed after ShardServiceImpl::kHelloDeadline (10 s): then a worker gets in.
  auto c = client_when_let_in(psd, 150, 100ms);
  REQUIRE(c);
  CHECK_THAT(psd.log(), Catch::Contains("no hello within 10 s"));
}

TEST_CASE("psd out of file descriptors serves on: a failed accept is retried, not the end") {
  TempDir dir;
  // psd inherits this process's descriptor limit while it starts.
  rlimit saved{};
  ::getrlimit(RLIMIT_NOFILE, &saved);
  rlimit low = saved;
  low.rlim_cur = 64;
  ::setrlimit(RLIMIT_NOFILE, &low);
  std::unique_ptr<PsdProcess> psd;
  try {
    psd = std::make_unique<PsdProcess>(std::vector<std::string>{
        "--http_port", "any", "--http_port_file", dir.path() + "/http_port"});
  } catch (...) {
    ::setrlimit(RLIMIT_NOFILE, &saved);
    throw;
  }
  ::setrlimit(RLIMIT_NOFILE, &saved);
  Client client(options_for(*psd));
  client.create({{.name = "x", .shape = {1}, .init = InitConfig::constant(5)}});
  const int http_port = ps::test::read_port_file(dir.path() + "/http_port");
  {
    // More idle connections than psd has descriptors: its accepts fail.
    std::vector<std::unique_ptr<IdleConnection>> idle;
    for (int i = 0; i < 60; ++i) idle.push_back(std::make_unique<IdleConnection>(http_port));
    for (int i = 0; i < 20; ++i) idle.push_back(std::make_unique<IdleConnection>(psd->port()));
    std::this_thread::sleep_for(500ms);
    CHECK(psd->alive());
  }
  CHECK_THAT(psd->log(), Catch::Contains("accepting a") && Catch::Contains("Too many open files"));
  // The idle ones gone, psd serves old and new clients.
  CHECK(client.pull("x") == std::vector<float>{5});
  auto fresh = client_when_let_in(*psd, 100, 50ms);
  REQUIRE(fresh);
  fresh->declare({{.name = "x", .shape = {1}}});
  CHECK(fresh->pull("x") == std::vector<float>{5});
}

namespace {

// A connection whose reading can be stopped: a peer that sends requests and
// never reads the replies.
class StallingStream final : public kj::AsyncIoStream {
 public:
  explicit StallingStream(kj::Own<kj::AsyncIoStream> inner) : inner_(kj::mv(inner)) {}
  bool stalled = false;
  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    if (stalled) return kj::Promise<size_t>(kj::NEVER_DONE);
    return inner_->tryRead(buffer, min_bytes, max_bytes);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
};

uint64_t rss_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace

TEST_CASE(
    "a client that sends requests and never reads the replies does not grow psd's memory without "
    "bound") {
  PsdProcess psd;
  {
    Client setup(options_for(psd));
    setup.create({{.name = "t", .shape = {15000}}});  // 60 KB, copied into each reply
  }
  auto io = kj::setupAsyncIo();
  auto addr = io.provider->getNetwork().parseAddress(psd.address()).wait(io.waitScope);
  auto stream = kj::heap<StallingStream>(addr->connect().wait(io.waitScope));
  capnp::TwoPartyClient rpc(*stream);
  auto shard = rpc.bootstrap().castAs<wire::Shard>();
  auto hello = shard.helloRequest();
  hello.setProtocolVersion(wire::K_PROTOCOL_VERSION);
  hello.setWorkerIndex(-1);
  hello.send().wait(io.waitScope);
  stream->stalled = true;
  kj::Vector<kj::Promise<void>> pulls;  // kept: a dropped call is cancelled
  for (int i = 0; i < 20000; ++i) {
    auto req = shard.pullRequest();
    req.initNames(1).set(0, "t");
    pulls.add(req.send().ignoreResult());
  }
  io.provider->getTimer()
      .afterDelay(3 * kj::SECONDS)
      .wait(io.waitScope);  // psd serves what it will
  // 20,000 replies of 60 KB are 1.2 GB; psd stops reading past 64 MiB queued.
  CHECK(rss_bytes(psd.pid()) < (300u << 20));
  // And serves others meanwhile.
  std::vector<float> got;
  std::thread other([&] {
    Client c(options_for(psd));
    c.declare({{.name = "t", .shape = {15000}}});
    got = c.pull("t");
  });
  other.join();
  CHECK(got.size() == 15000);
}
