// Command-line flags parsed as every program of this project parses them:
// --help prints the flags and exits 0; a bad flag is one line on stderr,
// "<program>: error: ...; see --help" (naming the flag most likely meant for
// an unknown one), and exit code 2, as for any other configuration error.
//
// Example:
//   int main(int argc, char** argv) {
//     CLI::App app{"my_trainer: ..."};
//     int epochs = 1;
//     app.add_option("--epochs", epochs, "passes over the data");
//     PS_PARSE_FLAGS(app, argc, argv);  // returns from main after --help or a bad flag
//     ...
//   }
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace ps {

// Parses argv into `app`. Returns -1 to go on, else the code main returns:
// 0 after --help (printed to stdout), 2 after a bad flag (said on stderr).
int parse_flags(CLI::App& app, int argc, char** argv);

// The line a bad flag gets, without the program's name: an unknown flag
// with the closest known one, else CLI11's own message.
std::string flag_error(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv);

}  // namespace ps

#define PS_PARSE_FLAGS(app, argc, argv)                                                 \
  do {                                                                                  \
    if (const int ps_parse_rc = ::ps::parse_flags(app, argc, argv); ps_parse_rc >= 0) \
      return ps_parse_rc;                                                               \
  } while (0)
