// A KJ event loop for tests of code that runs on one (socket streams, the
// client's message stream): wait() fails the test after 5 s instead of hanging.
#pragma once

#include <kj/async-unix.h>
#include <kj/timer.h>

namespace ps::test {

struct Loop {
  kj::UnixEventPort port;
  kj::EventLoop loop{port};
  kj::WaitScope ws{loop};

  template <typename T>
  T wait(kj::Promise<T> p) {
    return port.getTimer().timeoutAfter(5 * kj::SECONDS, kj::mv(p)).wait(ws);
  }
};

}  // namespace ps::test
