// Fuzz target: prediction configs (predict::parse_predict_config). Refusals are ConfigErrors;
// an accepted config's resolved form must parse again to itself.
#include "config/json_section.hpp"
#include "fuzz/fuzz_support.hpp"
#include "predict/predict_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  scape::fuzz::check_config_parser<scape::config::ConfigError>(
      data, size, [](const nlohmann::json& j) { return scape::predict::parse_predict_config(j).to_json(); });
  return 0;
}
