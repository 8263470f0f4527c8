// Fuzz target: checkpoints (train::load_checkpoint, as --resume loads them) and the StateMap
// decoding the MPI state gather shares. A checkpoint may be refused only with a ConfigError
// naming the file. When the first input byte is odd the trailing checksum is recomputed, so
// the fuzzer also reaches the parser behind the checksum.
//
// With SCAPE_FUZZ_SEED_DIR set, initialisation writes a real checkpoint of its config there
// (a 2-worker SCAPE run on a 64-parameter quadratic, stopped after step 4): the seed corpus.
#include <cstring>
#include <stdexcept>

#include "fuzz/fuzz_support.hpp"
#include "sim/sim_run.hpp"
#include "train/checkpoint.hpp"
#include "util/fnv1a.hpp"

namespace cfg = scape::config;
namespace tr = scape::train;

namespace {

constexpr std::size_t kParams = 64;

const cfg::ExperimentConfig& config() {
  static const cfg::ExperimentConfig c = cfg::parse_experiment({{"workers", 2},
                                                                {"steps", 6},
                                                                {"model", {{"type", "quadratic"}, {"size", kParams}}},
                                                                {"optimizer", {{"type", "scape"}, {"sparsity", 0.9}}}},
                                                               scape::fuzz::scratch());
  return c;
}

void write_seed(const std::filesystem::path& dir) {
  tr::RunOptions options;
  options.out = scape::fuzz::scratch() / "seed.h5";
  options.quiet = true;
  options.checkpoint_every = 2;
  options.before_step = [](int, int step) {
    if (step == 5) throw std::runtime_error("stopped after step 4 for the seed checkpoint");
  };
  (void)scape::sim::run_simulated(config(), options);
  const std::string bytes = scape::fuzz::read_bytes(tr::checkpoint_path(options.out));
  std::filesystem::create_directories(dir);
  for (const char flag : {'\0', '\1'}) {
    std::ofstream out(dir / (flag ? "step4-fix-checksum" : "step4"), std::ios::binary);
    out.put(flag);
    out << bytes;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("SCAPE_FUZZ_SEED_DIR")) write_seed(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string bytes(scape::fuzz::as_text(data + 1, size - 1));
  if ((data[0] & 1) != 0 && bytes.size() >= 8) {
    const std::uint64_t sum = scape::fnv1a_64(std::string_view(bytes).substr(0, bytes.size() - 8));
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, sizeof sum);
  }
  const auto run_file = scape::fuzz::scratch() / "run.h5";
  scape::fuzz::write_scratch("run.h5.ckpt", bytes);
  try {
    const tr::Checkpoint c = tr::load_checkpoint(config(), run_file, kParams, /*allow_unchecked=*/true);
    if (c.params.size() != kParams || c.states.size() != 2)
      scape::fuzz::invariant_broken("accepted a checkpoint of another shape");
  } catch (const cfg::ConfigError&) {
  }
  try {
    (void)tr::decode_state_map(std::span<const char>(bytes.data(), bytes.size()));
  } catch (const tr::StateFormatError&) {
  }
  return 0;
}
