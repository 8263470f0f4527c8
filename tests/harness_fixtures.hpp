// Test helper for the end-to-end tests of the `scape` command (tests/test_harness.cpp,
// test_harness_sweep.cpp): the configs they run and the run-file reads they share.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "run_file/hdf5.hpp"
#include "test_support.hpp"

namespace scape::testing::harness {

namespace fs = std::filesystem;

inline void write_file(const fs::path& p, const std::string& text) { write_text_file(p, text); }

// `config` written to DIR/NAME.json and run, quiet, into DIR/NAME.h5.
inline CommandResult run_config(const TempDir& dir, const std::string& name, const std::string& config) {
  write_file(dir.path / (name + ".json"), config);
  return run_scape("run " + (dir.path / (name + ".json")).string() + " --out " + (dir.path / (name + ".h5")).string() +
                   " --quiet");
}

inline std::vector<double> read_metric(const fs::path& file, const std::string& name) {
  auto f = run_file::File::open(file, run_file::Access::read);
  return f.open_dataset("/metrics/" + name).read_all<double>();
}

inline constexpr const char* kQuadratic = R"({
  "name": "quad", "seed": 3, "workers": 4, "steps": 12,
  "model": {"type": "quadratic", "size": 5000, "noise": 0.5},
  "optimizer": {"type": "scape", "sparsity": 0.99, "lr": 0.01},
  "network": {"alpha_us": 2.0, "bandwidth_GBps": 10.0},
  "log": {"flush_interval": 3}
})";

inline constexpr const char* kTinyGpt = R"({
  "name": "gpt", "seed": 1, "workers": 2, "steps": 6,
  "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 32},
  "data": {"type": "synthetic", "batch_size": 2, "tokens": 20000},
  "optimizer": {"type": "scape", "sparsity": 0.9, "lr": 0.003},
  "eval": {"interval": 3, "batches": 1},
  "log": {"flush_interval": 2, "save_params": true}
})";

}  // namespace scape::testing::harness
