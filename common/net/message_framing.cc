#include "common/net/message_framing.h"

#include <sys/socket.h>

#include <kj/exception.h>

namespace ps {

kj::Array<uint32_t> segment_table(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  auto table = kj::heapArray<uint32_t>(segment_table_bytes(static_cast<uint32_t>(segments.size())) /
                                       sizeof(uint32_t));
  table[0] = static_cast<uint32_t>(segments.size() - 1);
  for (size_t i = 0; i < segments.size(); ++i)
    table[i + 1] = static_cast<uint32_t>(segments[i].size());
  if (segments.size() % 2 == 0) table[table.size() - 1] = 0;
  return table;
}

kj::Maybe<int> send_buffer_size(SocketStream& stream) {
  int size = 0;
  kj::uint len = sizeof(size);
  KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                      [&] { stream.getsockopt(SOL_SOCKET, SO_SNDBUF, &size, &len); })) {
    return nullptr;
  }
  return size;
}

}  // namespace ps
