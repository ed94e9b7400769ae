#include "common/tensor_name.h"

#include <cstdio>

#include "ps/errors.h"
#include "ps/tensor_spec.h"

namespace ps {

void check_name(std::string_view name, const char* what) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    throw RequestError(std::string(what) + " names must have 1 to " +
                       std::to_string(kMaxNameBytes) + " bytes, got " +
                       std::to_string(name.size()));
  }
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      char code[8];
      std::snprintf(code, sizeof(code), "0x%02x", c);
      throw RequestError(std::string(what) + " name holds control character " + code + " at byte " +
                         std::to_string(i) + " (names may not hold NUL or control characters)");
    }
  }
}

std::string name_from_wire(capnp::Text::Reader text, const char* what) {
  std::string name(text.begin(), text.size());
  check_name(name, what);
  return name;
}

}  // namespace ps
