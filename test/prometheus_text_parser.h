// A strict reader of the Prometheus text format 0.0.4, for tests: every
// line must be a HELP/TYPE comment or a sample of a declared family, and
// histograms must be well formed (cumulative buckets ending in +Inf that
// equals _count, and a _sum). Throws std::runtime_error naming the problem.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ps::test {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromFamily {
  std::string type;  // counter, gauge, histogram, summary, untyped
  std::string help;
  std::vector<PromSample> samples;
};

class PromText {
 public:
  explicit PromText(const std::string& text);

  const std::map<std::string, PromFamily>& families() const { return families_; }
  bool has(const std::string& family) const { return families_.count(family) > 0; }
  // The value of the sample `name` with exactly these labels, if present.
  std::optional<double> value(const std::string& name,
                              const std::map<std::string, std::string>& labels = {}) const;

 private:
  std::map<std::string, PromFamily> families_;
};

}  // namespace ps::test
