// The memory ConnectionControl::hold_until_sent keeps alive: each hold is
// tied to the address a piece of a later write starts at, and that write
// takes it, to release it once the bytes are on the wire. Holds on one
// address are interchangeable: a write takes one per piece. Used by both
// streams that implement hold_until_sent (socket_stream, layered_stream).
//
//   holds.add(values->data(), values);                       // hold_until_sent
//   return send(pieces).attach(holds.take(pieces));          // write
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include <kj/common.h>

namespace ps {

class SendHolds {
 public:
  void add(const void* data, std::shared_ptr<const void> hold) {
    holds_.emplace(static_cast<const kj::byte*>(data), std::move(hold));
  }
  bool empty() const { return holds_.empty(); }
  // The holds of the pieces a write sends (one per piece that has any).
  std::vector<std::shared_ptr<const void>> take(
      kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
    std::vector<std::shared_ptr<const void>> taken;
    for (const auto& piece : pieces) {
      auto it = holds_.find(piece.begin());
      if (it == holds_.end()) continue;
      taken.push_back(std::move(it->second));
      holds_.erase(it);
    }
    return taken;
  }

 private:
  std::unordered_multimap<const kj::byte*, std::shared_ptr<const void>> holds_;
};

}  // namespace ps
