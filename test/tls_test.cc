// TLS (psd --tls_cert/--tls_key, ClientOptions::tls_ca) against real psd
// processes, with a throwaway CA and certificates made by openssl for each
// run: values cross exactly, a psd that fails the certificate check and a
// client that speaks plaintext are refused at once with one clear line, and
// nothing a peer sends to the TLS port stops psd from serving.
// Skipped (exit 77) without the openssl program.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "ps/client.h"
#include "test/http_test_util.h"
#include "test/psd_process.h"

using namespace ps;
using ps::test::PsdProcess;
using ps::test::tcp_connect;
using ps::test::TempDir;
using namespace std::chrono_literals;

namespace {

bool have_openssl() { return std::system("openssl version >/dev/null 2>&1") == 0; }

bool run(const std::string& command) {
  return std::system(("(" + command + ") >/dev/null 2>&1").c_str()) == 0;
}

// A CA (`name`.crt/.key in `dir`) and, signed by it, a certificate
// `leaf`.crt/.key for localhost and 127.0.0.1 (EC P-256: quick to make and
// to handshake). kj-tls checks a name as a DNS name, an IP address too: the
// address is listed as both.
void make_ca(const std::string& dir, const std::string& name) {
  REQUIRE(run("cd " + dir + " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 " +
              "-nodes -days 2 -subj /CN=" + name + " -keyout " + name + ".key -out " + name +
              ".crt"));
}
void make_leaf(const std::string& dir, const std::string& ca, const std::string& leaf,
               const std::string& names = "DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1") {
  REQUIRE(run("cd " + dir + " && printf 'subjectAltName=" + names + "\\n' > " + leaf +
              ".ext && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=" +
              leaf + " -keyout " + leaf + ".key -out " + leaf + ".csr && openssl x509 -req -in " +
              leaf + ".csr -CA " + ca + ".crt -CAkey " + ca + ".key -CAcreateserial -days 2 " +
              "-extfile " + leaf + ".ext -out " + leaf + ".crt"));
}

struct Pki {
  Pki() {
    make_ca(dir.path(), "ca");
    make_leaf(dir.path(), "ca", "psd");
    make_ca(dir.path(), "other-ca");
  }
  std::string path(const std::string& file) const { return dir.path() + "/" + file; }
  std::vector<std::string> psd_args() const {
    return {"--tls_cert", path("psd.crt"), "--tls_key", path("psd.key")};
  }
  TempDir dir;
};

ClientOptions options_for(const PsdProcess& psd, const std::string& ca) {
  ClientOptions o;
  o.ps_hosts = {psd.address()};
  o.connect_timeout = 3s;
  o.tls_ca = ca;
  return o;
}

// The message of the ConnectionError constructing a Client throws, and how
// long that took ("" if it did not throw).
std::string refusal(const ClientOptions& o, std::chrono::milliseconds* took) {
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    Client c(o);
  } catch (const ConnectionError& e) {
    what = e.what();
  }
  *took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                start);
  return what;
}

// What a client that works sees: exact values through TLS.
void check_serves(const PsdProcess& psd, const Pki& pki) {
  Client c(options_for(psd, pki.path("ca.crt")));
  c.create({{.name = "probe", .shape = {3}, .init = InitConfig::constant(1.5f)}});
  CHECK(c.pull("probe") == std::vector<float>{1.5f, 1.5f, 1.5f});
}

}  // namespace

TEST_CASE("over TLS, pushes and pulls carry exact values, small and multi-message") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  PsdProcess psd(pki.psd_args());
  CHECK_THAT(psd.log(), Catch::Contains("(TLS)"));
  ClientOptions o = options_for(psd, pki.path("ca.crt"));
  o.max_request_bytes = 256u << 10;  // the large tensor goes as several messages
  Client c(o);
  CHECK(c.connection_addresses() == std::vector<std::string>{psd.address()});

  constexpr size_t kLarge = 3u << 20;  // 12 MiB of floats: parts over several messages
  std::vector<float> init(kLarge);
  std::iota(init.begin(), init.end(), 0.0f);
  c.create({{.name = "w",
             .shape = {5},
             .optimizer = OptimizerConfig::sgd(0.5f),
             .init = InitConfig::constant(1)},
            {.name = "big",
             .shape = {kLarge},
             .optimizer = OptimizerConfig::sgd(1.0f),
             .init = InitConfig::from_values(init)}});
  std::vector<float> grad(kLarge);
  for (size_t i = 0; i < kLarge; ++i) grad[i] = static_cast<float>(i % 7) * 0.25f;
  c.push({"w", "big"}, {std::vector<float>{2, 4, 6, 8, 10}, grad});

  CHECK(c.pull("w") == std::vector<float>{0, -1, -2, -3, -4});
  std::vector<float> big(kLarge), w(5);
  c.pull({"w", "big"}, {std::span<float>(w), std::span<float>(big)});
  size_t wrong = 0;
  for (size_t i = 0; i < kLarge; ++i) wrong += big[i] != init[i] - grad[i];
  CHECK(wrong == 0);
  CHECK(w == std::vector<float>{0, -1, -2, -3, -4});
  CHECK(psd.alive());
}

TEST_CASE("a psd whose certificate does not check out is refused at once, in one line") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  PsdProcess psd(pki.psd_args());
  std::chrono::milliseconds took{};

  SECTION("signed by another CA") {
    const std::string what = refusal(options_for(psd, pki.path("other-ca.crt")), &took);
    CHECK_THAT(what,
               Catch::Contains("failed the TLS certificate check") && Catch::Contains("--tls_ca"));
    CHECK(what.find('\n') == std::string::npos);
    CHECK(what.find("OpenSSL") == std::string::npos);
  }
  SECTION("made out to another name") {
    ClientOptions o = options_for(psd, pki.path("ca.crt"));
    o.tls_server_name = "psd7.example";
    const std::string what = refusal(o, &took);
    CHECK_THAT(what, Catch::Contains("failed the TLS certificate check") &&
                         Catch::Contains("'psd7.example'"));
  }
  CHECK(took < 2s);  // not retried until connect_timeout (3 s)
  check_serves(psd, pki);
}

TEST_CASE("a plaintext client of a TLS psd is told to use TLS, and psd serves on") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  PsdProcess psd(pki.psd_args());
  std::chrono::milliseconds took{};
  const std::string what = refusal(options_for(psd, ""), &took);
  CHECK_THAT(what, Catch::Contains("requires TLS") && Catch::Contains("--tls_ca"));
  CHECK(what.find('\n') == std::string::npos);
  CHECK(what.find("remote exception") == std::string::npos);
  CHECK(took < 2s);
  CHECK_THAT(psd.log(), Catch::Contains("refused a plaintext connection from 127.0.0.1:"));
  check_serves(psd, pki);
}

TEST_CASE("past --max_connections a TLS client gets psd's refusal inside TLS") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  auto args = pki.psd_args();
  args.insert(args.end(), {"--max_connections", "1"});
  PsdProcess psd(args);
  Client first(options_for(psd, pki.path("ca.crt")));
  std::chrono::milliseconds took{};
  const std::string what = refusal(options_for(psd, pki.path("ca.crt")), &took);
  CHECK_THAT(what, Catch::Contains("maximum of 1 connections"));
  CHECK(took < 2s);
  first.create({{.name = "x", .shape = {1}, .init = InitConfig::constant(2)}});
  CHECK(first.pull("x") == std::vector<float>{2});
}

TEST_CASE("a TLS client of a plaintext psd is told what to check") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  PsdProcess psd;
  ClientOptions o = options_for(psd, pki.path("ca.crt"));
  o.connect_timeout = 1s;
  std::chrono::milliseconds took{};
  const std::string what = refusal(o, &took);
  CHECK_THAT(what, Catch::Contains("did not answer in TLS") && Catch::Contains("--tls_cert"));
  CHECK(what.find('\n') == std::string::npos);
  CHECK(psd.alive());
}

TEST_CASE("raw bytes on the TLS port do not disturb psd") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  PsdProcess psd(pki.psd_args());
  std::mt19937 rng(29);
  for (int round = 0; round < 40; ++round) {
    const int fd = tcp_connect(psd.port());
    REQUIRE(fd >= 0);
    std::string junk(1 + rng() % 3000, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    // Half the rounds look like the start of a TLS handshake record.
    if (round % 2 == 0) junk.replace(0, 3, std::string("\x16\x03\x01", 3));
    if (round % 4 == 0) junk += std::string(5, '\xff');
    (void)!::write(fd, junk.data(), junk.size());
    if (round % 3 == 0) ::shutdown(fd, SHUT_WR);
    ::close(fd);
  }
  // One that starts a handshake and stalls, one that says nothing.
  const int stalled = tcp_connect(psd.port());
  (void)!::write(stalled, "\x16\x03\x01\x02\x00", 5);
  const int silent = tcp_connect(psd.port());
  check_serves(psd, pki);
  ::close(stalled);
  ::close(silent);
  CHECK(psd.alive());
  CHECK_THAT(psd.log(), Catch::Contains("TLS connection from 127.0.0.1:"));
}

TEST_CASE("with --tls_client_ca only clients with a certificate from that CA get in") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  make_ca(pki.dir.path(), "clients-ca");
  make_leaf(pki.dir.path(), "clients-ca", "worker0", "DNS:worker0");
  make_leaf(pki.dir.path(), "other-ca", "intruder", "DNS:intruder");
  auto args = pki.psd_args();
  args.insert(args.end(), {"--tls_client_ca", pki.path("clients-ca.crt")});
  PsdProcess psd(args);
  ClientOptions o = options_for(psd, pki.path("ca.crt"));
  o.connect_timeout = 1s;
  std::chrono::milliseconds took{};
  // Refused after the client's handshake (TLS 1.3): on its first read or
  // write, as an alert or a hang-up, either way one line naming TLS.
  for (const char* who : {"", "intruder"}) {
    o.tls_cert = *who ? pki.path(std::string(who) + ".crt") : "";
    o.tls_key = *who ? pki.path(std::string(who) + ".key") : "";
    const std::string what = refusal(o, &took);
    CHECK_THAT(what, Catch::Contains("psd at " + psd.address()) && Catch::Contains("TLS"));
    CHECK(what.find("OpenSSL") == std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
  o.tls_cert = pki.path("worker0.crt");
  o.tls_key = pki.path("worker0.key");
  Client c(o);
  c.create({{.name = "x", .shape = {2}, .init = InitConfig::constant(7)}});
  CHECK(c.pull("x") == std::vector<float>{7, 7});
  CHECK(psd.alive());
}

TEST_CASE("bad TLS files are a one-line configuration error") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  ClientOptions o;
  o.ps_hosts = {"127.0.0.1:1"};
  o.tls_ca = pki.path("missing.crt");
  CHECK_THROWS_WITH(Client(o), Catch::Contains("cannot read --tls_ca file"));
  o.tls_ca = pki.path("psd.key");
  CHECK_THROWS_WITH(Client(o), Catch::Contains("holds no PEM certificate"));
  // psd: a key that is not the certificate's.
  TempDir log_dir;
  const std::string log = log_dir.path() + "/psd.log";
  const pid_t pid =
      ps::test::spawn_logged({ps::test::program_path("PSD_BIN"), "--port", "0", "--tls_cert",
                              pki.path("psd.crt"), "--tls_key", pki.path("other-ca.key")},
                             log);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 100 && done == 0; ++i) {
    done = ::waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(100ms);
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  REQUIRE(done == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) != 0);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("is not the private key of --tls_cert file"));
}

TEST_CASE("the HTTP port speaks HTTPS with the same certificate") {
  if (!have_openssl()) std::exit(77);
  if (std::system("curl --version >/dev/null 2>&1") != 0) {
    WARN("curl not installed: HTTPS not checked");
    return;
  }
  Pki pki;
  TempDir dir;
  auto args = pki.psd_args();
  args.insert(args.end(), {"--http_port", "any", "--http_port_file", dir.path() + "/http_port"});
  PsdProcess psd(args);
  const int port = ps::test::read_port_file(dir.path() + "/http_port");
  const std::string out = dir.path() + "/healthz";
  const std::string url = "https://127.0.0.1:" + std::to_string(port) + "/healthz";
  CHECK(run("curl -sS --max-time 5 --cacert " + pki.path("ca.crt") + " -o " + out + " " + url));
  std::ifstream in(out);
  std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(body, Catch::Contains("ok"));
  // Plain HTTP, or a CA that did not sign it: no answer.
  CHECK(ps::test::http_get(port, "/healthz").status == 0);
  CHECK_FALSE(run("curl -sS --max-time 5 --cacert " + pki.path("other-ca.crt") + " " + url));
  check_serves(psd, pki);
}

TEST_CASE("peers that connect to the TLS port and never handshake cannot keep a client out") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  auto args = pki.psd_args();
  args.insert(args.end(), {"--max_connections", "8"});
  PsdProcess psd(args);
  std::vector<int> silent;
  for (int i = 0; i < 8; ++i) {
    const int fd = tcp_connect(psd.port());
    REQUIRE(fd >= 0);
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);  // all accepted, none near the hello deadline
  ClientOptions o = options_for(psd, pki.path("ca.crt"));
  o.worker_index = 0;
  std::string what;
  try {
    Client c(o);
    c.create({{.name = "probe", .shape = {1}, .init = InitConfig::constant(3)}});
    CHECK(c.pull("probe") == std::vector<float>{3});
  } catch (const std::exception& e) {
    what = e.what();
  }
  CHECK(what == "");
  for (int fd : silent) ::close(fd);
  CHECK(psd.alive());
}

TEST_CASE("junk connections past the per-address cap write a few log lines, not one each") {
  if (!have_openssl()) std::exit(77);
  Pki pki;
  auto args = pki.psd_args();
  args.insert(args.end(), {"--max_connections_per_peer", "2"});
  PsdProcess psd(args);
  std::vector<int> stalled;  // hold the address's places
  for (int i = 0; i < 2; ++i) {
    stalled.push_back(tcp_connect(psd.port()));
    REQUIRE(stalled.back() >= 0);
    (void)!::write(stalled.back(), "\x16", 1);
  }
  std::this_thread::sleep_for(200ms);
  constexpr int kJunk = 60;
  const std::string junk = std::string("\x16\x03\x01\x00\x05junk!", 10) + std::string(64, '\0');
  for (int i = 0; i < kJunk; ++i) {
    const int fd = tcp_connect(psd.port());
    if (fd < 0) continue;
    (void)!::write(fd, junk.data(), junk.size());
    char buf[256];
    timeval tv{.tv_sec = 1, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)!::read(fd, buf, sizeof buf);  // psd's refusal, or its close
    ::close(fd);
  }
  for (int fd : stalled) ::close(fd);
  // The closed connections free their places as psd reads their ends.
  std::chrono::milliseconds took{};
  for (int i = 0; i < 50 && !refusal(options_for(psd, pki.path("ca.crt")), &took).empty(); ++i)
    std::this_thread::sleep_for(100ms);
  check_serves(psd, pki);
  const std::string log = psd.log();
  INFO(log.substr(0, 3000));
  // Each refused handshake once reached the task set's unthrottled warning.
  CHECK(ps::test::count_of(log, "connection task failed") == 0);
  CHECK(ps::test::count_of(log, "TLS connection from 127.0.0.1") <= 6);
  CHECK(ps::test::count_of(log, "\n") < 30);
}

TEST_CASE("peers that connect to the HTTPS port and never handshake cannot keep /healthz out") {
  if (!have_openssl()) std::exit(77);
  if (std::system("curl --version >/dev/null 2>&1") != 0) {
    WARN("curl not installed: HTTPS not checked");
    return;
  }
  Pki pki;
  TempDir dir;
  auto args = pki.psd_args();
  args.insert(args.end(), {"--http_port", "any", "--http_port_file", dir.path() + "/http_port"});
  PsdProcess psd(args);
  const int port = ps::test::read_port_file(dir.path() + "/http_port");
  std::vector<int> silent;
  for (int i = 0; i < 80; ++i) {
    const int fd = tcp_connect(port);
    REQUIRE(fd >= 0);
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);
  const std::string out = dir.path() + "/healthz";
  const std::string url = "https://127.0.0.1:" + std::to_string(port) + "/healthz";
  // From another address, as a prober elsewhere would be.
  CHECK(run("curl -sS --max-time 2 --interface 127.0.0.2 --cacert " + pki.path("ca.crt") +
            " -o " + out + " " + url));
  for (int fd : silent) ::close(fd);
  CHECK(psd.alive());
}
