// Shared-secret tokens for psd's hello (--auth_token_file on psd,
// ClientOptions::auth_token / auth_token_file in libpsclient).
#pragma once

#include <string>

namespace ps {

// Reads a token file: its contents without trailing whitespace / newlines.
// Throws ConfigError when it cannot be read, is not a regular file (a device
// or FIFO would never end), is empty or holds more than 4096 bytes; logs a
// warning when other users may read it.
std::string read_auth_token(const std::string& path);

}  // namespace ps
