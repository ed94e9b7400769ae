// UTF-8 checks for text a peer chose that psd or a trainer writes where
// UTF-8 is required (names on the HTTP pages, TensorBoard tags).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ps {

// Length of the valid UTF-8 sequence at s[i], or 0 if there is none
// (overlong forms, surrogates and code points past U+10FFFF are not).
inline std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  std::size_t n = c < 0x80           ? 1
                  : (c >> 5) == 0x6  ? 2
                  : (c >> 4) == 0xe  ? 3
                  : (c >> 3) == 0x1e ? 4
                                     : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  }
  uint32_t cp = n == 1 ? c : c & (0x7f >> n);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (byte(i + k) & 0x3f);
  const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

// `s` itself when it is valid UTF-8; else a copy in `scratch` with each
// byte that is not part of a valid sequence as U+FFFD.
inline std::string_view valid_utf8(std::string_view s, std::string& scratch) {
  std::size_t i = 0;
  for (std::size_t n; i < s.size() && (n = utf8_sequence(s, i)) > 0;) i += n;
  if (i == s.size()) return s;
  scratch.assign(s.substr(0, i));
  while (i < s.size()) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) {
      scratch += "\xef\xbf\xbd";
      ++i;
    } else {
      scratch.append(s.substr(i, n));
      i += n;
    }
  }
  return scratch;
}

}  // namespace ps
