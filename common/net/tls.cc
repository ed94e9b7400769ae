#include "common/net/tls.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <arpa/inet.h>

#include <kj/compat/tls.h>
#include <kj/debug.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/net/layered_stream.h"
#include "ps/errors.h"

namespace ps {

namespace {

// A TLS connection's first record is a handshake (content type 22).
constexpr kj::byte kTlsHandshakeRecord = 0x16;

std::string read_pem(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read " + flag + " file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN ") == std::string::npos)
    throw ConfigError(flag + " file '" + path + "' holds no PEM block (-----BEGIN ...)");
  return text.str();
}

// Runs `parse`, turning a kj exception (OpenSSL refused the text) into a
// ConfigError naming the flag and file.
template <class F>
auto parsed(const std::string& path, const std::string& flag, const std::string& what, F&& parse) {
  try {
    return parse();
  } catch (const kj::Exception& e) {
    throw ConfigError(flag + " file '" + path + "' is not a PEM " + what + " OpenSSL can use (" +
                      tls_reason(e) + ")");
  }
}

bool key_matches_certificate(const std::string& cert_pem, const std::string& key_pem) {
  BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  X509* cert = cert_bio ? PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr) : nullptr;
  EVP_PKEY* key = key_bio ? PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr) : nullptr;
  const bool match = cert != nullptr && key != nullptr && X509_check_private_key(cert, key) == 1;
  EVP_PKEY_free(key);
  X509_free(cert);
  BIO_free(key_bio);
  BIO_free(cert_bio);
  ERR_clear_error();
  return match;
}

bool is_ip_address(const std::string& name) {
  in6_addr v6;
  return ::inet_pton(AF_INET, name.c_str(), &v6) == 1 ||
         ::inet_pton(AF_INET6, name.c_str(), &v6) == 1;
}

// What the context is built from; kept so that nothing it refers to goes
// away before it (OpenSSL counts its own references, kj's options do not say).
struct Material {
  std::vector<kj::TlsCertificate> trusted;
  kj::Maybe<kj::TlsKeypair> keypair;
};

std::unique_ptr<kj::TlsContext> make_context(const std::string& cert_path,
                                             const std::string& cert_flag,
                                             const std::string& key_path,
                                             const std::string& key_flag,
                                             const std::string& ca_path, const std::string& ca_flag,
                                             bool verify_clients) {
  Material m;
  if (!ca_path.empty()) {
    const std::string pem = read_pem(ca_path, ca_flag);
    // A bundle: every certificate in the file is trusted.
    size_t at = 0;
    const std::string end_marker = "-----END CERTIFICATE-----";
    while (true) {
      const size_t begin = pem.find("-----BEGIN CERTIFICATE-----", at);
      if (begin == std::string::npos) break;
      const size_t end = pem.find(end_marker, begin);
      if (end == std::string::npos) break;
      at = end + end_marker.size();
      const std::string one = pem.substr(begin, at - begin);
      m.trusted.push_back(parsed(ca_path, ca_flag, "certificate",
                                 [&] { return kj::TlsCertificate(kj::StringPtr(one.c_str())); }));
    }
    if (m.trusted.empty())
      throw ConfigError(ca_flag + " file '" + ca_path + "' holds no PEM certificate");
  }
  if (cert_path.empty() != key_path.empty()) {
    throw ConfigError(cert_path.empty() ? key_flag + " needs " + cert_flag
                                        : cert_flag + " needs " + key_flag);
  }
  if (!cert_path.empty()) {
    const std::string cert_pem = read_pem(cert_path, cert_flag);
    const std::string key_pem = read_pem(key_path, key_flag);
    auto cert = parsed(cert_path, cert_flag, "certificate",
                       [&] { return kj::TlsCertificate(kj::StringPtr(cert_pem.c_str())); });
    auto key = parsed(key_path, key_flag, "private key",
                      [&] { return kj::TlsPrivateKey(kj::StringPtr(key_pem.c_str())); });
    // OpenSSL would silently drop a key that does not match the certificate.
    if (!key_matches_certificate(cert_pem, key_pem)) {
      throw ConfigError(key_flag + " file '" + key_path + "' is not the private key of " +
                        cert_flag + " file '" + cert_path + "'");
    }
    m.keypair = kj::TlsKeypair{kj::mv(key), kj::mv(cert)};
  }
  kj::TlsContext::Options options;
  options.useSystemTrustStore = false;
  options.verifyClients = verify_clients;
  options.trustedCertificates = kj::arrayPtr(m.trusted.data(), m.trusted.size());
  KJ_IF_MAYBE (kp, m.keypair) {
    options.defaultKeypair = *kp;
  }
  try {
    return std::make_unique<kj::TlsContext>(kj::mv(options));
  } catch (const kj::Exception& e) {
    // The key does not belong to the certificate, most likely.
    throw ConfigError(cert_flag + " and " + key_flag + " ('" + cert_path + "', '" + key_path +
                      "') do not make a usable key pair (" + tls_reason(e) + ")");
  }
}

kj::Exception failed(std::string message) {
  return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(message));
}

kj::Exception disconnected(std::string message) {
  return kj::Exception(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__, kj::str(message));
}

}  // namespace

std::string tls_reason(const kj::Exception& e) {
  std::string d = e.getDescription().cStr();
  // kj: "OpenSSL error; message = error:0A000086:SSL routines::certificate verify failed",
  // possibly several lines; the first OpenSSL reason says it.
  const size_t err = d.find("error:");
  if (err != std::string::npos) {
    std::string line = d.substr(err, d.find('\n', err) - err);
    const size_t colons = line.rfind(':');
    if (colons != std::string::npos && colons + 1 < line.size()) return line.substr(colons + 1);
  }
  // kj's own checks: "... TLS peer's certificate is not trusted; reason = ..."
  const size_t reason = d.find("reason = ");
  if (reason != std::string::npos) return d.substr(reason + 9);
  const size_t semicolon = d.find("; ");
  return semicolon == std::string::npos ? d : d.substr(0, semicolon);
}

TlsServer::TlsServer(const TlsServerFiles& files)
    : context_(make_context(files.cert, "--tls_cert", files.key, "--tls_key", files.client_ca,
                            "--tls_client_ca", !files.client_ca.empty())) {
  if (files.cert.empty()) throw ConfigError("TLS needs --tls_cert and --tls_key");
}

TlsServer::~TlsServer() = default;

kj::Promise<TlsServer::Accepted> TlsServer::accept(kj::Own<SocketStream> socket) {
  auto first = kj::heapArray<kj::byte>(1);
  auto& s = *socket;
  kj::byte* at = first.begin();
  return s.tryRead(at, 1, 1).then([this, socket = kj::mv(socket), first = kj::mv(first)](
                                      size_t n) mutable -> kj::Promise<Accepted> {
    if (n == 0) return disconnected("closed before saying anything");
    SocketStream& under = *socket;
    const bool tls = first[0] == kTlsHandshakeRecord;
    auto replayed = replay_first(kj::mv(first), kj::mv(socket));
    if (!tls) return Accepted{layer_socket(kj::mv(replayed), under), true};
    return context_->wrapServer(kj::mv(replayed))
        .then(
            [&under](kj::Own<kj::AsyncIoStream> session) -> kj::Promise<Accepted> {
              return Accepted{layer_socket(kj::mv(session), under), false};
            },
            [](kj::Exception&& e) -> kj::Promise<Accepted> {
              return failed("TLS handshake failed: " + tls_reason(e));
            });
  });
}

kj::Promise<kj::Own<kj::AsyncIoStream>> TlsServer::accept_stream(
    kj::Own<kj::AsyncIoStream> stream) {
  return context_->wrapServer(kj::mv(stream))
      .catch_([](kj::Exception&& e) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        return failed("TLS handshake failed: " + tls_reason(e));
      });
}

TlsClient::TlsClient(const TlsClientFiles& files)
    : context_(make_context(files.cert, "--tls_client_cert", files.key, "--tls_client_key",
                            files.ca, "--tls_ca", false)) {
  if (files.ca.empty()) throw ConfigError("TLS needs a CA file (--tls_ca, ClientOptions::tls_ca)");
}

TlsClient::~TlsClient() = default;

kj::Promise<kj::Own<SocketStream>> TlsClient::connect(kj::Own<SocketStream> socket,
                                                      const std::string& server_name,
                                                      const std::string& address) {
  SocketStream& under = *socket;
  return kj::evalNow([&] { return context_->wrapClient(kj::mv(socket), server_name); })
      .then(
          [&under,
           address](kj::Own<kj::AsyncIoStream> session) -> kj::Promise<kj::Own<SocketStream>> {
            // Under TLS 1.3 psd checks a client certificate after the client's
            // handshake is done: its refusal arrives on the first read or write.
            return layer_socket(kj::mv(session), under, [address](kj::Exception&& e) {
              const std::string why = tls_reason(e);
              if (e.getType() == kj::Exception::Type::DISCONNECTED) {
                return disconnected("psd at " + address + " closed the TLS session (" + why +
                                    "; a psd with --tls_client_ca does so for a client without "
                                    "its certificate)");
              }
              if (std::string(e.getDescription().cStr()).find("OpenSSL") == std::string::npos)
                return kj::mv(e);
              std::string hint;
              if (why.find("certificate") != std::string::npos ||
                  why.find("unknown ca") != std::string::npos)
                hint =
                    ": psd requires a client certificate signed by its --tls_client_ca "
                    "(--tls_client_cert and --tls_client_key, ClientOptions::tls_cert/tls_key)";
              return failed("psd at " + address + " ended the TLS session (" + why + ")" + hint);
            });
          },
          [address, server_name](kj::Exception&& e) -> kj::Promise<kj::Own<SocketStream>> {
            const std::string why = tls_reason(e);
            const std::string no_tls =
                " (is psd started with --tls_cert? one without TLS "
                "cannot answer a TLS client)";
            if (e.getType() == kj::Exception::Type::DISCONNECTED ||
                why.find("no certificate") != std::string::npos ||
                why.find("unexpected eof") != std::string::npos) {
              // Retried: a psd shutting down hangs up too.
              return disconnected("psd at " + address + " hung up in the TLS handshake" + no_tls);
            }
            if (why.find("wrong version number") != std::string::npos ||
                why.find("packet length too long") != std::string::npos ||
                why.find("record layer failure") != std::string::npos) {
              return failed("psd at " + address + " did not answer in TLS" + no_tls);
            }
            if (why.find("certificate verify failed") != std::string::npos ||
                std::string(e.getDescription().cStr()).find("not trusted") != std::string::npos ||
                why.find("hostname mismatch") != std::string::npos) {
              // kj-tls checks the name as a DNS name (X509_check_host), IP addresses included.
              const std::string ip_note =
                  is_ip_address(server_name)
                      ? " as a DNS name (subjectAltName DNS:" + server_name + ")"
                      : "";
              return failed("psd at " + address + " failed the TLS certificate check (" + why +
                            "): its --tls_cert must be signed by a CA in --tls_ca "
                            "(ClientOptions::tls_ca) and name '" +
                            server_name + "'" + ip_note +
                            " (tls_server_name; a trainer's --tls_server_name)");
            }
            return failed("TLS handshake with psd at " + address + " failed (" + why + ")");
          });
}

}  // namespace ps
