// Error types thrown by libpsclient. Every failure a user can cause or meet
// (bad configuration, a refused request, an unreachable shard) surfaces as one
// of these, with a message that names what was wrong.
#pragma once

#include <stdexcept>
#include <string>

namespace ps {

// Base of everything libpsclient throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad flags, environment (TF_CONFIG, SLURM_*), or data files.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A shard refused a request (unknown tensor, wrong shape, NaN gradient, ...).
// The shard's state is unchanged.
class RequestError : public Error {
 public:
  using Error::Error;
};

// A shard could not be reached, or the connection broke.
class ConnectionError : public Error {
 public:
  using Error::Error;
};

// A waiting call given up because ClientOptions::interrupted said so.
class InterruptedError : public Error {
 public:
  using Error::Error;
};

}  // namespace ps
