// Error text for people: what a system call or library said, without the
// library's internals (KJ's "::bind(sockfd, ...): ", "gai_strerror(r) = ",
// Cap'n Proto's "remote exception: "), and, for the usual causes, what to do.
//
//   throw ConfigError("cannot listen on " + addr + ": " + for_people(e.getDescription().cStr()));
//   // "cannot listen on 127.0.0.1:2222: address already in use (another process has the port:
//   ...)"
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace ps {

inline std::string for_people(std::string_view what) {
  std::string s(what);
  // Cap'n Proto's marker of an error from the other side, wherever a
  // message was wrapped around it.
  for (std::size_t at; (at = s.find("remote exception: ")) != std::string::npos;) s.erase(at, 18);
  bool changed = true;
  while (changed) {
    changed = false;
    for (std::string_view prefix :
         {"remote exception: ", "std::exception: ", "gai_strerror(r) = ", "connect: "}) {
      if (s.rfind(prefix, 0) == 0) {
        s.erase(0, prefix.size());
        changed = true;
      }
    }
    // A call as KJ writes it: "name(args...): " or "::name(args...): ".
    const std::size_t open = s.find('(');
    const std::size_t close = s.find("): ");
    if (open != std::string::npos && close != std::string::npos && open < close && open > 0) {
      bool call = true;
      for (std::size_t i = 0; i < open; ++i) {
        const char c = s[i];
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) call = false;
      }
      if (call) {
        s.erase(0, close + 3);
        changed = true;
      }
    }
  }
  // KJ appends its parameters: "...; toString() = 127.0.0.1:2222; params.host = x". Kept: the
  // resolver's own words; dropped: the rest.
  std::string kept;
  for (std::size_t start = 0; start <= s.size();) {
    std::size_t end = s.find("; ", start);
    if (end == std::string::npos) end = s.size();
    std::string part = s.substr(start, end - start);
    start = end + 2;
    const std::size_t eq = part.find(" = ");
    if (eq != std::string::npos && part.find(' ') == eq) {
      if (part.rfind("gai_strerror", 0) != 0) continue;
      part = part.substr(eq + 3);
    }
    while (!part.empty() && (part.back() == '.' || part.back() == ' ')) part.pop_back();
    if (part.empty()) continue;
    kept += (kept.empty() ? "" : ": ") + part;
  }
  s = kept;
  // "Address already in use" reads as part of a sentence; "DNS ..." stays.
  if (s.size() > 1 && std::islower(static_cast<unsigned char>(s[1]))) {
    s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  }
  auto has = [&](std::string_view t) { return s.find(t) != std::string::npos; };
  // Once: a message passed through here twice keeps one hint.
  auto hint = [&](const std::string& h) {
    if (!has(h)) s += " (" + h + ")";
  };
  if (has("ddress already in use")) {
    hint("another process has this port: stop it, or choose another (0 or 'any' picks a free one)");
  } else if (has("annot assign requested address")) {
    hint("not an address of this host: give one of its addresses, or 0.0.0.0 for all");
  } else if ((has("ame or service not known") || has("o address associated with hostname") ||
              has("emporary failure in name resolution")) &&
             !has("unknown host name")) {
    s = "unknown host name (" + s + "): check its spelling, or give an IP address";
  } else if (has("onnection refused")) {
    hint("nothing listens there: is psd running, on this port?");
  } else if (has("ermission denied")) {
    hint("ports below 1024 need root, or the file or directory is not yours");
  }
  return s;
}

}  // namespace ps
