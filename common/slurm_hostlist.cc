// Slurm's compressed host lists and task counts.
//   "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5
//   "2(x3),1"             -> 2 2 2 1
// Zero padding follows the written lower bound ("[08-10]" -> 08 09 10), as
// Slurm's hostlist does. Several bracket groups in one name
// ("r[1-2]n[1-2]") expand as a cartesian product, left group outermost.
#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include "ps/cluster_spec.h"
#include "ps/errors.h"

namespace ps::slurm {
namespace {

constexpr size_t kMaxHosts = 1 << 20;  // guards against "n[0-999999999]"

// Quotes s. (Also sidesteps GCC 12's false -Wrestrict on "'" + std::string.)
std::string q(std::string_view s) {
  std::string r;
  r.reserve(s.size() + 2);
  r += '\'';
  r.append(s);
  r += '\'';
  return r;
}

[[noreturn]] void bad(std::string_view list, const std::string& why) {
  throw ConfigError("Slurm host list " + q(list) + ": " + why);
}

bool to_num(std::string_view s, unsigned long long& v) {
  if (s.empty() || s.size() > 18) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

// Expands the inside of one bracket: "01-03,07" -> {"01","02","03","07"}.
std::vector<std::string> expand_range(std::string_view inside, std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = inside.find(',', start);
    std::string_view item = inside.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) bad(list, "empty range inside []");
    size_t dash = item.find('-');
    std::string_view lo_s = item.substr(0, dash);
    std::string_view hi_s = dash == std::string_view::npos ? lo_s : item.substr(dash + 1);
    unsigned long long lo = 0, hi = 0;
    if (!to_num(lo_s, lo) || !to_num(hi_s, hi))
      bad(list, q(item) + " is not a number or lo-hi range");
    if (lo > hi) bad(list, "range " + q(item) + " runs backwards");
    if (hi - lo >= kMaxHosts) bad(list, "range " + q(item) + " is too large");
    if (hi - lo >= kMaxHosts - out.size()) bad(list, "too many hosts");
    for (unsigned long long v = lo; v <= hi; ++v) {
      std::string n = std::to_string(v);
      if (n.size() < lo_s.size()) n.insert(0, lo_s.size() - n.size(), '0');
      out.push_back(std::move(n));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// Expands one host expression (no top-level commas).
void expand_one(std::string_view expr, std::string_view list, std::vector<std::string>& out) {
  std::vector<std::string> acc{""};
  size_t i = 0;
  while (i < expr.size()) {
    size_t open = expr.find('[', i);
    std::string_view lit =
        expr.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    if (lit.find(']') != std::string_view::npos) bad(list, "unmatched ']'");
    for (auto& a : acc) a += lit;
    if (open == std::string_view::npos) break;
    size_t close = expr.find(']', open);
    if (close == std::string_view::npos) bad(list, "unmatched '['");
    std::string_view inside = expr.substr(open + 1, close - open - 1);
    if (inside.find('[') != std::string_view::npos) bad(list, "nested '['");
    auto parts = expand_range(inside, list);
    if (acc.size() * parts.size() > kMaxHosts) bad(list, "too many hosts");
    std::vector<std::string> next;
    next.reserve(acc.size() * parts.size());
    for (const auto& a : acc)
      for (const auto& p : parts) next.push_back(a + p);
    acc = std::move(next);
    i = close + 1;
  }
  if (acc.size() > kMaxHosts - out.size()) bad(list, "too many hosts");
  for (auto& a : acc) {
    if (a.empty()) bad(list, "empty host name");
    out.push_back(std::move(a));
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      std::string_view expr = list.substr(start, i - start);
      if (expr.empty()) bad(list, "empty entry");
      for (char c : expr)
        if (c == ' ' || c == '\t' || c == '\n') bad(list, "whitespace inside the list");
      expand_one(expr, list, out);
      start = i + 1;
    } else if (list[i] == '[') {
      ++depth;
    } else if (list[i] == ']') {
      if (--depth < 0) bad(list, "unmatched ']'");
    }
  }
  if (depth != 0) bad(list, "unmatched '['");
  return out;
}

std::vector<int> expand_tasks_per_node(std::string_view spec) {
  auto fail = [&](const std::string& why) -> std::vector<int> {
    throw ConfigError("Slurm tasks per node " + q(spec) + ": " + why);
  };
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    size_t comma = spec.find(',', start);
    std::string_view item = spec.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) return fail("empty entry");
    unsigned long long count = 0, repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')')
        return fail(q(item) + " is not N or N(xR)");
      if (!to_num(item.substr(paren + 2, item.size() - paren - 3), repeat) || repeat == 0)
        return fail("bad repeat count in " + q(item));
      item = item.substr(0, paren);
    }
    if (!to_num(item, count) || count == 0 || count > 65535)
      return fail(q(item) + " is not a task count in 1..65535");
    if (repeat > kMaxHosts || out.size() + repeat > kMaxHosts) return fail("too many nodes");
    out.insert(out.end(), repeat, static_cast<int>(count));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace ps::slurm
