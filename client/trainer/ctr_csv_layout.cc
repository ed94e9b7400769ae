// Click data as a CSV with a header line (Avazu's train.csv): the columns'
// roles from their names, and a data line into a CtrExample.
#include <chrono>
#include <set>

#include <fmt/format.h>

#include "client/trainer/ctr_text.h"
#include "ps/ctr_data.h"
#include "ps/errors.h"

namespace ps {
namespace {

// Splits on commas (no quoting: Avazu's files have none).
void split_commas(std::string_view line, std::vector<std::string_view>& out) {
  out.clear();
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    out.push_back(line.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return;
    start = comma + 1;
  }
}

using detail::shown;
using detail::without_cr;

// YYMMDDHH (20YY) -> hour of the day and day of the week (0 = Sunday).
bool parse_hour(std::string_view s, uint32_t& hour, uint32_t& weekday) {
  if (s.size() != 8) return false;
  int v[4];
  for (int k = 0; k < 4; ++k) {
    const char a = s[2 * k], b = s[2 * k + 1];
    if (a < '0' || a > '9' || b < '0' || b > '9') return false;
    v[k] = (a - '0') * 10 + (b - '0');
  }
  namespace c = std::chrono;
  const c::year_month_day day{c::year{2000 + v[0]}, c::month{static_cast<unsigned>(v[1])},
                              c::day{static_cast<unsigned>(v[2])}};
  if (!day.ok() || v[3] > 23) return false;
  hour = static_cast<uint32_t>(v[3]);
  weekday = c::weekday{c::sys_days{day}}.c_encoding();
  return true;
}

}  // namespace

uint32_t ctr_text_value(std::string_view text) {
  uint32_t h = 2166136261u;
  for (const char ch : text) {
    h ^= static_cast<unsigned char>(ch);
    h *= 16777619u;
  }
  return h;
}

CtrCsvLayout CtrCsvLayout::from_header(std::string_view header) {
  CtrCsvLayout l;
  std::vector<std::string_view> names;
  split_commas(without_cr(header), names);
  std::set<std::string_view> seen;
  int fields = 0;
  for (std::size_t c = 0; c < names.size(); ++c) {
    const std::string_view n = names[c];
    if (n.empty()) throw ConfigError(fmt::format("CSV header: column {} has no name", c + 1));
    if (!seen.insert(n).second)
      throw ConfigError(fmt::format("CSV header: column {} ({}) named twice", c + 1, shown(n)));
    l.names_.emplace_back(n);
    int field = -1;
    if (n == "click")
      l.label_ = static_cast<int>(c);
    else if (n == "hour")
      l.hour_ = static_cast<int>(c);
    else if (n != "id")
      field = fields++;
    l.field_.push_back(field);
  }
  if (l.label_ < 0) {
    throw ConfigError(
        "CSV header has no 'click' column, the label (Avazu's test.csv has none: only labelled "
        "data can be trained on); the header was " +
        shown(header));
  }
  if (l.hour_ >= 0) {
    l.hour_field_ = fields;
    fields += 2;
  }
  if (fields > kCtrCategorical) {
    throw ConfigError(fmt::format(
        "CSV header: {} categorical fields (hour counts two), more than the {} a trainer takes",
        fields, kCtrCategorical));
  }
  return l;
}

bool CtrCsvLayout::parse(std::string_view line, CtrExample& out, std::string* error) const {
  const auto fail = [&](std::string why) {
    if (error) *error = std::move(why);
    return false;
  };
  thread_local std::vector<std::string_view> f;
  split_commas(without_cr(line), f);
  if (f.size() != names_.size()) {
    return fail(fmt::format("expected {} comma-separated fields (the header's), got {}",
                            names_.size(), f.size()));
  }
  out = CtrExample{};
  if (f[label_] == "0" || f[label_] == "1")
    out.label = f[label_] == "1" ? 1.0f : 0.0f;
  else
    return fail(fmt::format("click: expected 0 or 1, got {}", shown(f[label_])));
  if (hour_ >= 0) {
    uint32_t hour = 0, weekday = 0;
    if (!parse_hour(f[hour_], hour, weekday))
      return fail(fmt::format("hour: expected YYMMDDHH, got {}", shown(f[hour_])));
    out.categorical[hour_field_] = hour;
    out.categorical[hour_field_ + 1] = weekday;
    out.categorical_present[hour_field_] = out.categorical_present[hour_field_ + 1] = true;
  }
  for (std::size_t c = 0; c < f.size(); ++c) {
    const int field = field_[c];
    if (field < 0 || f[c].empty()) continue;
    out.categorical[field] = ctr_text_value(f[c]);
    out.categorical_present[field] = true;
  }
  return true;
}

}  // namespace ps
