// CRC-32C (Castagnoli), the checksum of TFRecord/TensorBoard event files and
// of psd's checkpoint records.
//
//   uint32_t c = ps::crc32c(buf, n);             // one buffer
//   c = ps::crc32c(more, m, c);                  // extended over more data
//   uint32_t stored = ps::mask_crc(c);           // as TFRecord frames store it
#pragma once

#include <cstddef>
#include <cstdint>

namespace ps {

// CRC-32C (Castagnoli), as TFRecord uses. crc32c("123456789") == 0xE3069283.
// Pass a previous result as `crc` to extend it over more data.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t unmask_crc(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace ps
