// Fuzz target: run configs (config::parse_experiment). Any JSON may be refused only with a
// ConfigError; an accepted config's resolved form (what a run records) must parse again to
// itself, and its run id must survive a dump and parse.
#include "config/config.hpp"
#include "fuzz/fuzz_support.hpp"

namespace cfg = scape::config;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  scape::fuzz::check_config_parser<cfg::ConfigError>(data, size, [](const nlohmann::json& j) {
    const nlohmann::json resolved = cfg::parse_experiment(j, scape::fuzz::scratch()).to_json();
    if (cfg::run_id(resolved) != cfg::run_id(nlohmann::json::parse(resolved.dump())))
      scape::fuzz::invariant_broken("the run id changes through a dump and parse");
    return resolved;
  });
  return 0;
}
