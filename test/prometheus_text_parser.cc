#include "test/prometheus_text_parser.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

namespace ps::test {
namespace {

bool name_char(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

std::string read_name(const std::string& line, std::size_t& pos) {
  std::size_t start = pos;
  while (pos < line.size() && name_char(line[pos], pos == start)) ++pos;
  return line.substr(start, pos - start);
}

double parse_value(const std::string& v, const std::string& line) {
  if (v == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (v == "+Inf") return std::numeric_limits<double>::infinity();
  if (v == "-Inf") return -std::numeric_limits<double>::infinity();
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw std::runtime_error("bad value '" + v + "' in: " + line);
  return d;
}

PromSample parse_sample(const std::string& line) {
  PromSample s;
  std::size_t pos = 0;
  s.name = read_name(line, pos);
  if (s.name.empty()) throw std::runtime_error("no metric name in: " + line);
  if (pos < line.size() && line[pos] == '{') {
    ++pos;
    while (pos < line.size() && line[pos] != '}') {
      std::string label = read_name(line, pos);
      if (label.empty() || pos + 1 >= line.size() || line[pos] != '=' || line[pos + 1] != '"') {
        throw std::runtime_error("bad label in: " + line);
      }
      pos += 2;
      std::string value;
      while (pos < line.size() && line[pos] != '"') {
        if (line[pos] == '\\' && pos + 1 < line.size()) {
          char e = line[++pos];
          value += e == 'n' ? '\n' : e;
        } else {
          value += line[pos];
        }
        ++pos;
      }
      if (pos >= line.size()) throw std::runtime_error("unterminated label value in: " + line);
      ++pos;  // closing quote
      if (!s.labels.emplace(label, value).second)
        throw std::runtime_error("label '" + label + "' twice in: " + line);
      if (pos < line.size() && line[pos] == ',') ++pos;
    }
    if (pos >= line.size()) throw std::runtime_error("unterminated label set in: " + line);
    ++pos;  // '}'
  }
  if (pos >= line.size() || line[pos] != ' ')
    throw std::runtime_error("no space before the value in: " + line);
  std::istringstream rest(line.substr(pos + 1));
  std::string value, timestamp, extra;
  rest >> value >> timestamp >> extra;
  if (!extra.empty()) throw std::runtime_error("trailing text in: " + line);
  s.value = parse_value(value, line);
  return s;
}

// The family a sample belongs to: its own name, or for histograms and
// summaries the name without _bucket/_sum/_count.
std::string family_of(const std::string& sample,
                      const std::map<std::string, PromFamily>& families) {
  if (families.count(sample)) return sample;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    std::string s(suffix);
    if (sample.size() > s.size() && sample.compare(sample.size() - s.size(), s.size(), s) == 0) {
      std::string base = sample.substr(0, sample.size() - s.size());
      auto it = families.find(base);
      if (it != families.end() &&
          (it->second.type == "histogram" || (it->second.type == "summary" && s != "_bucket"))) {
        return base;
      }
    }
  }
  return "";
}

void check_histogram(const std::string& name, const PromFamily& f) {
  // Group by the labels other than le.
  struct Series {
    std::vector<std::pair<double, double>>
        buckets;  // (le, cumulative count), in order of appearance
    std::optional<double> sum, count;
  };
  std::map<std::map<std::string, std::string>, Series> series;
  for (const auto& s : f.samples) {
    auto labels = s.labels;
    labels.erase("le");
    Series& x = series[labels];
    if (s.name == name + "_bucket") {
      auto le = s.labels.find("le");
      if (le == s.labels.end()) throw std::runtime_error(name + ": bucket without le");
      x.buckets.emplace_back(parse_value(le->second, s.name), s.value);
    } else if (s.name == name + "_sum") {
      x.sum = s.value;
    } else if (s.name == name + "_count") {
      x.count = s.value;
    } else {
      throw std::runtime_error(name + ": unexpected sample " + s.name);
    }
  }
  if (series.empty()) throw std::runtime_error(name + ": histogram without samples");
  for (const auto& [labels, x] : series) {
    if (x.buckets.empty() || !std::isinf(x.buckets.back().first))
      throw std::runtime_error(name + ": buckets must end in le=\"+Inf\"");
    for (std::size_t i = 1; i < x.buckets.size(); ++i) {
      if (!(x.buckets[i].first > x.buckets[i - 1].first))
        throw std::runtime_error(name + ": le not increasing");
      if (x.buckets[i].second < x.buckets[i - 1].second)
        throw std::runtime_error(name + ": buckets not cumulative");
    }
    if (!x.sum || !x.count) throw std::runtime_error(name + ": missing _sum or _count");
    if (*x.count != x.buckets.back().second)
      throw std::runtime_error(name + ": _count differs from the +Inf bucket");
  }
}

}  // namespace

PromText::PromText(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::set<std::string> seen_samples;
  std::string current;  // samples of a family must follow its TYPE line, together
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream c(line.substr(1));
      std::string keyword, name;
      c >> keyword >> name;
      if (keyword != "HELP" && keyword != "TYPE") continue;  // other comments are allowed
      std::string rest;
      std::getline(c, rest);
      if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
      PromFamily& f = families_[name];
      if (keyword == "HELP") {
        if (!f.help.empty()) throw std::runtime_error("second HELP for " + name);
        f.help = rest;
      } else {
        static const std::set<std::string> types = {"counter", "gauge", "histogram", "summary",
                                                    "untyped"};
        if (!types.count(rest)) throw std::runtime_error("unknown TYPE '" + rest + "' for " + name);
        if (!f.type.empty()) throw std::runtime_error("second TYPE for " + name);
        if (!f.samples.empty()) throw std::runtime_error("TYPE for " + name + " after its samples");
        f.type = rest;
        current = name;
      }
      continue;
    }
    PromSample s = parse_sample(line);
    std::string family = family_of(s.name, families_);
    if (family.empty() || families_[family].type.empty())
      throw std::runtime_error("sample of an undeclared family: " + line);
    if (family != current) throw std::runtime_error("sample outside its family's block: " + line);
    std::ostringstream key;
    key << s.name;
    for (const auto& [k, v] : s.labels) key << ',' << k << '=' << v;
    if (!seen_samples.insert(key.str()).second)
      throw std::runtime_error("duplicate sample: " + line);
    families_[family].samples.push_back(std::move(s));
  }
  for (const auto& [name, f] : families_) {
    if (f.type.empty()) throw std::runtime_error("HELP without TYPE for " + name);
    if (f.type == "histogram") check_histogram(name, f);
  }
}

std::optional<double> PromText::value(const std::string& name,
                                      const std::map<std::string, std::string>& labels) const {
  std::string family = family_of(name, families_);
  if (family.empty()) return std::nullopt;
  for (const auto& s : families_.at(family).samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

}  // namespace ps::test
