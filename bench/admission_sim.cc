// How many ids psd's count sketch (server/embedding/count_sketch.h) admits
// early, against exact counts, for a stream of skewed ids: the figures
// behind TableSpec::count_sketch_width's default (docs/embedding.md,
// "Admission by count"). No psd: the sketch alone, in this process.
//
//   build/bench/admission_sim                                  # the docs' stream
//   build/bench/admission_sim --distinct 20000000 --pushes 40000000 --min_count 3
#include <CLI/CLI.hpp>

#include <cstdio>
#include <random>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "server/embedding/count_sketch.h"
#include "ps/flag_parsing.h"

int main(int argc, char** argv) {
  CLI::App app{"Early admissions of psd's count sketch against exact counts"};
  uint64_t range = 6'000'000;
  uint64_t pushes = 12'000'000;
  uint32_t min_count = 2;
  std::vector<uint32_t> widths = {1u << 20, 1u << 22, 1u << 24};
  app.add_option("--distinct", range, "ids are range * u^3, u uniform in [0, 1)")
      ->capture_default_str();
  app.add_option("--pushes", pushes, "ids pushed, one at a time")->capture_default_str();
  app.add_option("--min_count", min_count, "pushes that admit an id")->capture_default_str();
  app.add_option("--widths", widths, "sketch widths to try")->capture_default_str();
  PS_PARSE_FLAGS(app, argc, argv);

  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<uint64_t> stream(pushes);
  for (auto& id : stream) {
    const double v = u(rng);
    id = uint64_t(double(range) * v * v * v) * 2654435761ull;
  }
  std::printf("%llu pushes of ids range * u^3 (range %llu), min_count %u\n",
              (unsigned long long)pushes, (unsigned long long)range, min_count);
  for (uint32_t width : widths) {
    ps::CountSketch sketch(width, 12345);
    std::unordered_map<uint64_t, uint32_t> exact;  // pushes of ids not yet admitted
    std::unordered_set<uint64_t> admitted;
    uint64_t early = 0;
    for (uint64_t id : stream) {
      if (admitted.count(id)) continue;
      uint32_t& seen = exact[id];
      if (sketch.count(id) + 1 >= min_count) {
        admitted.insert(id);
        early += seen + 1 < min_count;
        continue;
      }
      ++seen;
      sketch.add(id);
    }
    std::printf(
        "  width %9u (%6.1f MiB): %9zu distinct ids, %9zu admitted, %9llu of them early "
        "(%.2f%% of the distinct ids)\n",
        sketch.width(), double(sketch.bytes()) / (1 << 20), exact.size() + 0, admitted.size(),
        (unsigned long long)early, 100.0 * double(early) / double(exact.size()));
  }
  return 0;
}
