// Fuzz target: run files as --resume reopens them (train::RunLog on RunRecorder::
// open_for_resume), as `scape sweep` reads their summary (read_run_summary) and as `scape
// repair` checks them. Each input edits a completed run's file through HDF5 (h5_mutator.hpp)
// and picks the step to resume at; every refusal must be an H5Error naming the file, and a
// resumed file must finish and read back.
#include "fuzz/fuzz_support.hpp"
#include "fuzz/h5_mutator.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "sim/sim_run.hpp"
#include "train/gradient_source.hpp"
#include "train/run_log.hpp"

namespace cfg = scape::config;
namespace tr = scape::train;

namespace {

const cfg::ExperimentConfig& config() {
  static const cfg::ExperimentConfig c =
      cfg::parse_experiment({{"workers", 2},
                             {"steps", 6},
                             {"model", {{"type", "quadratic"}, {"size", 64}}},
                             {"optimizer", {{"type", "scape"}, {"sparsity", 0.9}}},
                             {"log", {{"flush_interval", 2}, {"save_params", true}}}},
                            scape::fuzz::scratch());
  return c;
}

tr::RunOptions options_for(const std::filesystem::path& out, bool resume) {
  tr::RunOptions o;
  o.out = out;
  o.quiet = true;
  o.resume = resume;
  return o;
}

const std::string& template_bytes() {
  static const std::string bytes = [] {
    const auto path = scape::fuzz::scratch() / "template.h5";
    (void)scape::sim::run_simulated(config(), options_for(path, false));
    return scape::fuzz::read_bytes(path);
  }();
  return bytes;
}

const scape::fuzz::H5Vocabulary& vocabulary() {
  static const scape::fuzz::H5Vocabulary v{
      {"metrics/step", "metrics/train_loss", "metrics/bytes_sent", "metrics", "eval/step", "eval/val_loss", "eval",
       "tensors/names", "tensors/mask_density", "tensors/residual_norm", "tensors", "final/params", "final"},
      {"config", "status", "steps_completed", "error", "layout_version", "scape_version", "git_sha", "unit"},
      {"running", "completed", "failed", "diverged", "killed", "theta", "", config().to_json().dump(2)}};
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return scape::fuzz::initialize_hdf5_target(template_bytes); }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::unique_ptr<tr::SourceData> source = tr::load_source_data(config());
  const auto path = scape::fuzz::write_scratch("run.h5", template_bytes());
  FuzzedDataProvider input(data, size);
  const int resume_step = input.ConsumeIntegralInRange(0, 8);
  scape::fuzz::mutate_hdf5(path, input, vocabulary());
  try {
    (void)scape::run_file::read_run_summary(path);
  } catch (const scape::run_file::H5Error&) {
  }
  const tr::RunOptions options = options_for(path, true);
  try {
    tr::RunLog log(config(), source->layout(), options, resume_step);
    (void)log.finish("");
  } catch (const scape::run_file::H5Error&) {
    return 0;
  }
  if (scape::run_file::read_run_summary(path).status != "completed")
    scape::fuzz::invariant_broken("a resumed file does not read back");
  return 0;
}
