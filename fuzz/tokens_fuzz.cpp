// Fuzz target: token data files (text, nanoGPT and llm.c shards) read through the run's own
// path, train::load_source_data on a tiny GPT config. The first input byte picks the data
// section (text, tokens with format auto / nanogpt / llmc) and the rest is the file. Refusals
// are ConfigErrors naming data.path; an accepted file yields batches without a sanitizer report.
#include "fuzz/fuzz_support.hpp"
#include "train/gradient_source.hpp"

namespace cfg = scape::config;
namespace tr = scape::train;

namespace {

constexpr int kSections = 4;

cfg::ExperimentConfig make_config(int section, const std::filesystem::path& file) {
  static const char* const kData[kSections] = {
      R"({"type": "text"})", R"({"type": "tokens", "format": "auto"})", R"({"type": "tokens", "format": "nanogpt"})",
      R"({"type": "tokens", "format": "llmc"})"};
  nlohmann::json j = {{"workers", 2},
                      {"steps", 2},
                      {"model", {{"type", "gpt"}, {"n_layer", 1}, {"n_head", 1}, {"n_embd", 4},
                                 {"block_size", 4}, {"vocab_size", section == 0 ? 256 : 300}}},
                      {"data", nlohmann::json::parse(kData[section])}};
  j["data"]["path"] = file.string();
  j["data"]["batch_size"] = 1;
  return cfg::parse_experiment(j, scape::fuzz::scratch());
}

// Parsed once per section: the file is always the same path, only its bytes change.
const cfg::ExperimentConfig& config_for(int section, const std::filesystem::path& file) {
  static const cfg::ExperimentConfig configs[kSections] = {make_config(0, file), make_config(1, file),
                                                           make_config(2, file), make_config(3, file)};
  return configs[section];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto file = scape::fuzz::write_scratch("data.bin", scape::fuzz::as_text(data + 1, size - 1));
  const cfg::ExperimentConfig& config = config_for(data[0] % kSections, file);
  std::unique_ptr<tr::SourceData> source;
  try {
    source = tr::load_source_data(config);
  } catch (const cfg::ConfigError&) {
    return 0;
  }
  std::vector<float> params(source->layout().size()), grads(params.size());
  source->init_params(params);
  const auto worker = tr::make_gradient_source(config, *source, 1);
  (void)worker->gradient(params, 1, grads);
  (void)worker->validation_loss(params, 1);
  return 0;
}
