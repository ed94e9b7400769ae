#include "ps/flag_parsing.h"

#include <algorithm>
#include <cstdio>
#include <string_view>
#include <vector>

namespace ps {

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The app's long flag closest to `name` (both without "--"), or "" when none is close.
std::string closest_flag(const CLI::App& app, std::string_view name) {
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, name.size() / 3) + 1;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) {
      const std::size_t d = edit_distance(name, l);
      if (d < best_distance) {
        best_distance = d;
        best = l;
      }
    }
  }
  return best;
}

std::string program_name(const char* argv0) {
  std::string_view p = argv0 != nullptr ? argv0 : "";
  if (const auto slash = p.rfind('/'); slash != std::string_view::npos) p.remove_prefix(slash + 1);
  return p.empty() ? "error" : std::string(p);
}

}  // namespace

std::string flag_error(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    // The first word given that no flag takes.
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      if (arg == "--") break;
      if (arg.size() < 3 || arg.substr(0, 2) != "--") continue;
      std::string_view name = arg.substr(2, arg.find('=') == std::string_view::npos
                                                ? std::string_view::npos
                                                : arg.find('=') - 2);
      if (app.get_option_no_throw("--" + std::string(name)) != nullptr) continue;
      std::string line = "unknown flag --" + std::string(name);
      if (const std::string near = closest_flag(app, name); !near.empty())
        line += " (did you mean --" + near + "?)";
      return line;
    }
  }
  std::string what = e.what();
  while (!what.empty() && (what.back() == '\n' || what.back() == '.')) what.pop_back();
  // CLI11's "Could not convert: --flag = value": said as the flag and what it takes.
  constexpr std::string_view kConvert = "Could not convert: ";
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr && what.starts_with(kConvert)) {
    const std::string rest = what.substr(kConvert.size());
    if (const auto eq = rest.find(" = "); eq != std::string::npos) {
      const std::string flag = rest.substr(0, eq), value = rest.substr(eq + 3);
      const CLI::Option* opt = app.get_option_no_throw(flag);
      std::string takes = opt != nullptr ? opt->get_type_name() : "";
      if (takes == "BOOLEAN")
        takes = "true or false";
      else if (takes == "UINT")
        takes = "a whole number >= 0";
      else if (takes == "INT")
        takes = "a whole number";
      else if (takes == "FLOAT")
        takes = "a number";
      return flag + " " + value + ": not a value it takes" +
             (takes.empty() ? std::string() : " (" + takes + ")");
    }
  }
  return what;
}

int parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s; see --help\n", program_name(argv[0]).c_str(),
                 flag_error(app, e, argc, argv).c_str());
    return 2;
  }
}

}  // namespace ps
