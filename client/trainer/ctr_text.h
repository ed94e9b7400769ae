// Text helpers the CTR line parsers share (ctr_data.cc's TSV, ctr_csv_layout.cc's CSV).
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace ps::detail {

// A field's text for an error message, quoted and cut short.
inline std::string shown(std::string_view s) {
  return s.size() <= 24 ? fmt::format("'{}'", s) : fmt::format("'{}...'", s.substr(0, 24));
}

// The line without the '\r' of a '\r\n' line end.
inline std::string_view without_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

}  // namespace ps::detail
