// Fuzz target: sweep files (config::expand_sweep) and the points they expand to. A sweep
// may be refused only with a ConfigError, and so may each point; base_file names resolve in a
// scratch folder holding base.json (the repository's quickstart run).
#include "config/config.hpp"
#include "fuzz/fuzz_support.hpp"

namespace cfg = scape::config;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scape::fuzz::write_scratch("base.json", scape::fuzz::repository_config("quickstart-run.json").dump());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  std::vector<cfg::SweepPoint> points;
  try {
    points = cfg::expand_sweep(j, scape::fuzz::scratch());
  } catch (const cfg::ConfigError&) {
    return 0;
  }
  constexpr std::size_t kPointsParsed = 8;  // enough to reach every path; the rest repeat them
  for (std::size_t i = 0; i < points.size() && i < kPointsParsed; ++i) {
    try {
      (void)cfg::parse_experiment(points[i].config, scape::fuzz::scratch());
    } catch (const cfg::ConfigError&) {
    }
  }
  return 0;
}
