// What psd accepts as a name (a tensor's, a split tensor's full name, a
// barrier's): 1 to kMaxNameBytes bytes, none of them a control character
// (0x00-0x1f, 0x7f). Checked on the full bytes a client sent: a NUL inside
// a name would otherwise cut it short wherever it becomes a C string, so
// "a\0b" would name tensor "a", and a huge name starting with a short one
// would pass the length limit.
//
//   check_name(spec.name, "create: tensor");               // throws RequestError
//   std::string n = name_from_wire(g.getName(), "push");   // the same, from a Text field
#pragma once

#include <string>
#include <string_view>

#include <capnp/blob.h>

namespace ps {

// Throws RequestError starting with `what` when `name` is not acceptable.
void check_name(std::string_view name, const char* what);

// The name in a Cap'n Proto Text field, all of its bytes (not up to the
// first NUL), after check_name.
std::string name_from_wire(capnp::Text::Reader text, const char* what);

}  // namespace ps
