// Prediction configuration: strict JSON -> typed config, with the section parser of the
// experiment configs (config/json_section.hpp): unknown keys, wrong types and out-of-range
// values are config::ConfigErrors naming the JSON path, so `scape predict` exits with
// status 2. The keys are declared in predict_keys.cpp; the optimizer section is parsed by the
// run-config parser itself. docs/PREDICTING.md lists every field and default.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"
#include "predict/step_model.hpp"
#include "predict/topology.hpp"
#include "presets/gpu_presets.hpp"
#include "presets/model_presets.hpp"

namespace scape::predict {

// The "format" of a hardware description (`scape predict --calibrate` writes one).
inline constexpr const char* kHardwareFormat = "scape-hardware-1";

enum class Scaling { strong, weak };
const char* to_string(Scaling s);

struct BatchSpec {
  Scaling scaling = Scaling::strong;
  int seq_len = 1024;
  std::int64_t global_sequences = 0;   // strong: the fixed global batch
  std::int64_t per_gpu_sequences = 0;  // weak: the fixed batch of one GPU
  // Sequences of one forward/backward (the rows of every GEMM are micro_sequences x seq_len);
  // only with gpu.compute_model "gemm", where it is required. 0 otherwise.
  std::int64_t micro_sequences = 0;

  double sequences_per_gpu(int workers) const;
  double tokens_per_gpu(int workers) const { return sequences_per_gpu(workers) * seq_len; }
  double global_tokens(int workers) const { return tokens_per_gpu(workers) * workers; }
};

// One level of the network: a shared preset (presets/network_presets.hpp), possibly overridden.
struct LinkSpec {
  std::string preset;  // "" when both figures were given
  double alpha_us = 0;
  double bandwidth_GBps = 0;
  NetworkModel model() const;
};

struct PredictConfig {
  std::string name = "predict";
  std::string description;
  std::string model_preset;  // "" for explicit dimensions
  presets::ModelSpec model;
  presets::AttentionFlops attention = presets::AttentionFlops::causal;
  BatchSpec batch;
  presets::GpuSpec gpu;
  // gpu.compute_model "gemm": the GPU preset's fitted curve, and compute is the per-GEMM model
  // (predict/gemm_model.hpp) instead of the FLOPs at gpu.mfu. Unfitted under "mfu".
  presets::GemmCurve gemm_curve;
  int gpus_per_node = 1;
  int nics_per_node = 1;
  LinkSpec inter;
  LinkSpec intra;
  std::array<std::optional<LinkSpec>, kCollectiveKindCount> collectives{};  // network.collectives, by CollectiveKind
  std::optional<LoadCurves> inter_curves;                                   // network.inter_curves
  std::string hardware;  // the hardware description merged in ("" when none)
  OverlapModel overlap;
  OptimizerConfig optimizer;
  OptimizerConfig baseline;
  double fill_in = 1.0;  // SCAPE local_union: |M| / K
  std::vector<int> workers;

  Topology topology() const;
  // Defaults filled in: what the prediction file records.
  nlohmann::json to_json() const;
};

// The dense optimizer a sparse one is compared with: AdamS (AdamW when its inner rule is
// AdamW) with the same sharding and wire precisions; a dense optimizer is its own baseline.
OptimizerConfig default_baseline(const OptimizerConfig& c);

// Throws config::ConfigError naming the field.
PredictConfig parse_predict_config(const nlohmann::json& j);
// Puts the gpu and network sections of the hardware description that `j["hardware"]` names
// (relative to `base_dir`) under the config's own; nothing without that key. Throws ConfigError
// naming the file when it cannot be read or is not a hardware description.
void merge_hardware(nlohmann::json& j, const std::filesystem::path& base_dir);
// Reads the file, applies --set overrides (key.path=value), merges the hardware, parses.
PredictConfig load_predict_config(const std::filesystem::path& file, const std::vector<std::string>& sets);
// JSON Schema (draft 2020-12) of a prediction config (`scape schema --predict`).
nlohmann::json predict_schema();

}  // namespace scape::predict
