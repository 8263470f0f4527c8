// Fuzz target: --set overrides (config::apply_override), one per input line, applied to
// the repository's quickstart run config, which is then parsed as `scape run --set` does. Both
// steps may refuse only with a ConfigError.
#include "config/config.hpp"
#include "fuzz/fuzz_support.hpp"

namespace cfg = scape::config;

namespace {
const nlohmann::json& base() {
  static const nlohmann::json j = scape::fuzz::repository_config("quickstart-run.json");
  return j;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)base();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json j = base();
  std::string_view text = scape::fuzz::as_text(data, size);
  try {
    while (!text.empty()) {
      const std::size_t end = std::min(text.find('\n'), text.size());
      cfg::apply_override(j, std::string(text.substr(0, end)));
      text.remove_prefix(std::min(end + 1, text.size()));
    }
    (void)cfg::parse_experiment(j, scape::fuzz::scratch());
  } catch (const cfg::ConfigError&) {
  }
  return 0;
}
