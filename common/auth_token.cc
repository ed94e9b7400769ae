#include "common/auth_token.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ps/errors.h"

namespace ps {

std::string read_auth_token(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read auth token file " + path + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) throw ConfigError("auth token file " + path + " is empty");
  if (token.size() > 4096)
    throw ConfigError("auth token file " + path + " holds more than 4096 bytes");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    // Not fatal (containers often mount secrets 0644), but worth knowing.
    std::fprintf(stderr, "warning: auth token file %s is readable by other users (chmod 600 it)\n",
                 path.c_str());
  }
  return token;
}

}  // namespace ps
