// What tells two processes they run on the same machine (the kernel's boot
// id): psd says its own in hello, and a client that finds it equal to its
// own may use psd's Unix-domain socket instead of TCP.
#pragma once

#include <string>

namespace ps {

// The kernel's boot id, read once; empty where it cannot be read.
const std::string& host_id();

}  // namespace ps
