// TLS for psd's TCP connections (kj-tls over OpenSSL): psd proves itself with
// a certificate and key (--tls_cert, --tls_key), the client checks it
// against a CA file (ClientOptions::tls_ca, --tls_ca) and the name it
// expects, and both then speak Cap'n Proto inside the session, through a
// SocketStream layered on the socket (common/net/layered_stream.h). psd may
// also require client certificates (--tls_client_ca). Unix-domain sockets
// stay plaintext: the kernel carries them within the host only.
//
// Failures are one line a person can act on, never OpenSSL's error stack:
// a file that cannot be read or parsed is a ConfigError naming the flag; a
// failed handshake is a kj::Exception whose description says what failed
// and what to check (FAILED: retrying cannot help; DISCONNECTED: the peer
// hung up, as a psd shutting down does).
//
//   TlsServer tls({"psd.crt", "psd.key", ""});         // psd
//   tls.accept(kj::mv(socket)).then([](TlsServer::Accepted a) { ... });
//
//   TlsClient tls({"ca.crt", "", ""});                 // client
//   tls.connect(kj::mv(socket), "psd0.example", "psd0.example:2222");
#pragma once

#include <memory>
#include <string>

#include <kj/async-io.h>

#include "common/net/socket_stream.h"

namespace kj {
class TlsContext;
}

namespace ps {

struct TlsServerFiles {
  std::string cert;       // PEM: psd's certificate, then any intermediates (--tls_cert)
  std::string key;        // PEM: its private key, unencrypted (--tls_key)
  std::string client_ca;  // PEM: CAs whose client certificates are required; empty: none
};

struct TlsClientFiles {
  std::string ca;    // PEM: the CAs trusted to sign psd's certificate (the system's are not)
  std::string cert;  // PEM: this client's certificate, for psd --tls_client_ca; empty: none
  std::string key;   // PEM: its private key
};

class TlsServer {
 public:
  // Reads and checks the files; ConfigError naming the flag otherwise.
  explicit TlsServer(const TlsServerFiles& files);
  ~TlsServer();

  // What spoke first on an accepted connection. A TLS client: `stream` is
  // the session, handshake done. A peer whose first byte cannot start a
  // TLS handshake: `plaintext`, and `stream` is the socket as it was (that
  // byte read again first), for psd to answer it in its own protocol that
  // it must use TLS. A handshake that fails rejects (FAILED, one line).
  struct Accepted {
    kj::Own<SocketStream> stream;
    bool plaintext = false;
  };
  kj::Promise<Accepted> accept(kj::Own<SocketStream> socket);

  // The handshake alone, on any stream (psd's HTTPS port).
  kj::Promise<kj::Own<kj::AsyncIoStream>> accept_stream(kj::Own<kj::AsyncIoStream> stream);

 private:
  std::unique_ptr<kj::TlsContext> context_;
};

class TlsClient {
 public:
  explicit TlsClient(const TlsClientFiles& files);
  ~TlsClient();

  // Handshake as the client over `socket`; psd's certificate must chain to
  // the CA file and carry `server_name` (a DNS name or an IP address among
  // its subjectAltNames). `address` is for messages.
  kj::Promise<kj::Own<SocketStream>> connect(kj::Own<SocketStream> socket,
                                             const std::string& server_name,
                                             const std::string& address);

 private:
  std::unique_ptr<kj::TlsContext> context_;
};

// The reason OpenSSL gave, from a kj-tls exception's description ("certificate
// verify failed", "tlsv1 alert unknown ca"), or the description itself.
std::string tls_reason(const kj::Exception& e);

}  // namespace ps
