#include "common/net/host_id.h"

#include <fstream>

namespace ps {

const std::string& host_id() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    std::getline(in, s);
    return s;
  }();
  return id;
}

}  // namespace ps
