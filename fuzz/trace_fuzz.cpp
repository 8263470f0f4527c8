// Fuzz target: gradient traces (scape::run_file::GradientTrace) read through the replay source, as
// a run with model.type "replay" reads them. Each input edits a valid two-worker trace through
// HDF5 (h5_mutator.hpp). Opening may refuse only with a ConfigError naming model.path; reading
// an accepted trace may fail only with an H5Error naming the file.
#include "fuzz/fuzz_support.hpp"
#include "fuzz/h5_mutator.hpp"
#include "run_file/hdf5.hpp"
#include "train/gradient_source.hpp"

namespace cfg = scape::config;
namespace tr = scape::train;

namespace {

constexpr std::size_t kMaxReadValues = 1 << 16;  // larger claimed traces are opened, not read (speed)

const std::string& template_bytes() {
  static const std::string bytes = [] {
    const auto path = scape::fuzz::scratch() / "template.h5";
    {
      const scape::run_file::File f = scape::run_file::File::create(path);
      const std::vector<std::string> names = {"wte", "ln.bias"};
      f.create_string_dataset("layout/names", names).close();
      const std::vector<std::int64_t> sizes = {3, 2};
      const std::vector<std::uint8_t> decay = {1, 0};
      f.create_dataset("layout/sizes", H5T_STD_I64LE, {{2}, {}, {}, {}}).write<std::int64_t>({0}, {2}, sizes);
      f.create_dataset("layout/decay", H5T_STD_U8LE, {{2}, {}, {}, {}}).write<std::uint8_t>({0}, {2}, decay);
      const std::vector<float> init = {0.5f, -1, 2, 0, 0.25f};
      f.create_dataset("init/params", H5T_IEEE_F32LE, {{5}, {}, {}, {}}).write<float>({0}, {5}, init);
      std::vector<float> grads(3 * 2 * 5);
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = 0.1f * static_cast<float>(i) - 1;
      f.create_dataset("grads", H5T_IEEE_F32LE, {{3, 2, 5}, {}, {1, 2, 5}, {}})
          .write<float>({0, 0, 0}, {3, 2, 5}, grads);
    }
    return scape::fuzz::read_bytes(path);
  }();
  return bytes;
}

const scape::fuzz::H5Vocabulary& vocabulary() {
  static const scape::fuzz::H5Vocabulary v{
      {"layout/names", "layout/sizes", "layout/decay", "init/params", "grads", "layout", "init"},
      {"unit", "doc"},
      {"wte", "ln.bias", "", "wte"}};
  return v;
}

cfg::ExperimentConfig replay_config(const std::filesystem::path& trace) {
  const nlohmann::json j = {{"workers", 2},
                            {"steps", 1},
                            {"model", {{"type", "replay"}, {"path", trace.string()}}},
                            {"optimizer", {{"type", "scape"}, {"sparsity", 0.5}}}};
  return cfg::parse_experiment(j, scape::fuzz::scratch());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return scape::fuzz::initialize_hdf5_target(template_bytes); }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = scape::fuzz::write_scratch("trace.h5", template_bytes());
  FuzzedDataProvider input(data, size);
  scape::fuzz::mutate_hdf5(path, input, vocabulary());
  static const cfg::ExperimentConfig config = replay_config(path);  // the path never changes
  std::unique_ptr<tr::SourceData> source;
  try {
    source = tr::load_source_data(config);
  } catch (const cfg::ConfigError&) {
    return 0;
  }
  if (source->layout().size() > kMaxReadValues) return 0;
  std::vector<float> params(source->layout().size()), grads(params.size());
  try {
    source->init_params(params);
    for (int rank = 0; rank < config.workers; ++rank)
      (void)tr::make_gradient_source(config, *source, rank)->gradient(params, 1, grads);
  } catch (const scape::run_file::H5Error&) {
  }
  return 0;
}
