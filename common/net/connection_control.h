// What the message layer above a connection (psd's RPC face, libpsclient's
// call layer) may ask of the socket under it, and nothing more: keep memory
// a message references alive until it is on the wire, and cut the
// connection. Reads, writes, read-ahead and landing stay between the socket
// and its message stream (common/net/socket_stream.h); the layers above see
// only this, so a test can stand in for the socket with a few lines.
//
// Implemented by SocketStream. A caller that may outlive the connection
// keeps a Weak, which does nothing once the connection is gone:
//
//   ps::ConnectionControl& connection = messages.connection();
//   connection.hold_until_sent(values->data(), values);   // a reply sent from `values`
//   ps::ConnectionControl::Weak cut = connection.weak();
//   ...
//   cut.abort();   // the call gave up: no more of its request is sent
//
// Single-threaded: used on the event loop that runs the connection.
#pragma once

#include <memory>

namespace ps {

class ConnectionControl {
 public:
  // Keeps `hold` alive until a write that sends a piece starting at `data`
  // has completed (or the connection is destroyed). For Cap'n Proto messages
  // that reference memory outside themselves (Orphanage::
  // referenceExternalData, which capnp writes as a piece of its own): psd
  // sends a tensor's values without copying them into the reply, holding
  // them (a copy-on-write view) until they are on the wire. Holds on the
  // same address are interchangeable: each such write releases one.
  virtual void hold_until_sent(const void* data, std::shared_ptr<const void> hold) = 0;

  // Cuts the connection: a write under way or to come fails (DISCONNECTED,
  // "connection cut: ...") without reading another byte of its pieces, and
  // reads see the end of the stream. For a caller that gives up on a
  // request going out from memory that is not the connection's (libpsclient
  // sends a push's gradient from the caller's buffer): once it has its
  // error, the caller may reuse or free that memory, and the rest of the
  // message must not be sent from it. The peer sees a truncated message and
  // drops it. Cutting twice is cutting once.
  virtual void abort() = 0;

  // A reference for a holder that may outlive the connection.
  class Weak {
   public:
    Weak() = default;
    // Whether the connection still exists (cut or not).
    bool alive() const { return !self_.expired(); }
    // Cuts the connection if it still exists; says whether it did.
    bool abort() const {
      auto self = self_.lock();
      if (!self) return false;
      (*self)->abort();
      return true;
    }

   private:
    friend class ConnectionControl;
    explicit Weak(std::weak_ptr<ConnectionControl* const> self) : self_(std::move(self)) {}
    std::weak_ptr<ConnectionControl* const> self_;
  };
  Weak weak() const { return Weak(self_); }

 protected:
  ConnectionControl() = default;
  ConnectionControl(const ConnectionControl&) = delete;
  ConnectionControl& operator=(const ConnectionControl&) = delete;
  ~ConnectionControl() = default;  // not owned through this face

 private:
  const std::shared_ptr<ConnectionControl* const> self_ =
      std::make_shared<ConnectionControl* const>(this);
};

}  // namespace ps
