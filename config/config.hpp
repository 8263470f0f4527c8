// Experiment configuration: strict JSON -> typed config. Unknown keys, wrong types and
// out-of-range values are ConfigErrors naming the JSON path (with the nearest valid key for a
// typo). The defaults are the members' initial values below (and OptimizerConfig's); the keys
// are declared once in config/config_keys.cpp (optimizer_keys.cpp for the optimizer) and listed in
// docs/configuration.md. The resolved config, defaults filled in, is what a run records.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/json_section.hpp"
#include "core/ledger.hpp"
#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"
#include "presets/gpu_presets.hpp"

namespace scape::config {

struct ModelSection {
  std::string type = "gpt";  // gpt | llama | replay | quadratic | external
  // gpt and llama
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;
  int block_size = 64;
  int vocab_size = 256;
  std::string precision = "fp32";  // fp32 | bf16: the linear layers' GEMMs (model/precision.hpp)
  // llama
  int n_kv_head = 0;   // 0: n_head
  int ffn_hidden = 0;  // 0: 8/3 n_embd rounded up to a multiple of 64
  // replay
  std::filesystem::path path;
  // quadratic (the synthetic gradient source of the optimizer tests)
  std::int64_t size = 65536;
  double noise = 0.5;
  double curvature_tail = 1.0;
};

struct DataSection {
  std::string type = "synthetic";  // synthetic | text | tokens
  std::filesystem::path path;      // text and tokens
  std::string format = "auto";     // tokens: auto | nanogpt | llmc
  int batch_size = 8;              // sequences per worker per step
  double val_fraction = 0.1;
  // synthetic Markov corpus
  std::int64_t tokens = 1000000;
  int successors = 4;
  double concentration = 0.9;
};

// Where the W ranks sit: nodes of ranks_per_node (G) consecutive ranks, W = nodes x G
// (optimizer.hierarchy = "node" exchanges densely inside a node).
struct TopologySection {
  int ranks_per_node = 1;
};

struct NetworkSection {
  std::string preset = "ib_ndr400";  // "" when given by alpha_us and bandwidth_GBps alone
  double alpha_us = 0;
  double bandwidth_GBps = 0;
  // The preset of the link between the ranks of one node (topology.ranks_per_node > 1); "" when
  // they talk over the same link as the nodes.
  std::string intra;
  NetworkModel model() const;        // the link between nodes
  NetworkModel intra_model() const;  // the link inside a node
};

// What the modelled step time (step_time_model) takes as compute: the measured CPU seconds of
// forward/backward on this machine, or the training FLOPs of the model shape on a GPU preset of
// the predictor at an assumed MFU (predict/compute_model.hpp).
struct ComputeSection {
  std::string type = "measured";  // measured | flops | sleep
  std::string device = "h100";    // flops: a GPU preset of presets/gpu_presets.hpp
  double mfu = presets::kDefaultMfu;
  // sleep: the seconds of forward and backward a step stands for; each rank sleeps out what its
  // own gradient did not take (a GPU stand-in for ranks that share a few cores).
  double seconds = 0;
};

struct EvalSection {
  int interval = 50;  // steps between validation evaluations (the last step always evaluates)
  int batches = 4;    // batches of data.batch_size * workers sequences
};

// The defaults below are the simulator's, whose workers share one memory: there the metrics that
// read every worker's whole gradient on rank 0 cost nothing on the wire. A multi-process run
// (--backend mpi, nccl) sends W N floats to rank 0 for each of them, so there oracle is off and
// gradient_metrics_interval sparse unless the config asks (apply_backend_defaults).
struct LogSection {
  int flush_interval = 10;
  bool save_params = false;
  bool oracle = true;  // mask_oracle_overlap and mask_energy_capture (docs/algorithms.md, "Metrics")
  // Steps between the metrics that need every worker's whole gradient on rank 0 (grad_norm and
  // the oracle metrics): they are taken at steps 1, 1 + k, 1 + 2k, ... and NaN elsewhere.
  int gradient_metrics_interval = 1;
};

// log.gradient_metrics_interval of a multi-process run that does not give it: grad_norm at steps
// 1, 101, 201, ... (W N floats to rank 0 each), about 1% of the steps.
inline constexpr int kMultiProcessGradientMetricsInterval = 100;
// Whether `backend` ("sim", "mpi", "nccl": scape run --backend) runs each worker in its own
// process, where a diagnostic that reads every worker's gradient sends it to rank 0.
bool is_multi_process_backend(std::string_view backend);
// The defaults that depend on the backend, written into the config JSON `j` (before
// parse_experiment) where it leaves them out: on a multi-process backend log.oracle = false and
// log.gradient_metrics_interval = kMultiProcessGradientMetricsInterval. The simulator's config is
// left as it is, so its resolved configs and run ids do not change. The resolved config, which
// the run file records, then holds what ran.
void apply_backend_defaults(nlohmann::json& j, std::string_view backend);

struct ExperimentConfig {
  std::string name = "run";
  std::string description;
  std::uint64_t seed = 1;
  int workers = 4;
  int steps = 200;
  // Where the model, its parameters and gradients live and run (the optimizer follows unless
  // optimizer.device is given).
  kernels::DeviceKind device = kernels::DeviceKind::cpu;
  ModelSection model;
  DataSection data;
  OptimizerConfig optimizer;
  TopologySection topology;
  NetworkSection network;
  ComputeSection compute;
  EvalSection eval;
  LogSection log;

  bool has_data() const { return model.type == "gpt" || model.type == "llama"; }
  // The models with an eval section: the language models, and external gradients, whose caller
  // may hand in a validation loss.
  bool has_eval() const { return has_data() || model.type == "external"; }
  // Defaults filled in, paths absolute: the JSON a run records and hashes.
  nlohmann::json to_json() const;
  // The world communicator's link class and link: intra when all W ranks share one node
  // (W = ranks_per_node > 1), else inter (a flat collective among several nodes crosses them).
  LinkClass world_link_class() const;
  NetworkModel world_link() const;
};

// Throws ConfigError naming the key of what `backend` cannot run: optimizer.hierarchy = "node"
// over NCCL (its groups are compiled, not run).
void check_backend(const ExperimentConfig& config, std::string_view backend);
// Parses and validates one experiment. Relative paths resolve against base_dir.
ExperimentConfig parse_experiment(const nlohmann::json& j, const std::filesystem::path& base_dir);
// Reads a JSON file (errors name the file and the line), applies --set overrides, parses.
nlohmann::json read_json_file(const std::filesystem::path& path);
// "a.b.c=value": value parsed as JSON when it parses, else taken as a string.
void apply_override(nlohmann::json& j, const std::string& assignment);
// Sets the dotted key (intermediate objects created) to value; errors name `where` (a sweep's
// grid or point key, or the --set).
void set_dotted(nlohmann::json& j, const std::string& key, const nlohmann::json& value, const std::string& where);
// SHA-256-free stable id: 16 hex digits of a 64-bit hash of the resolved config's dump.
std::string run_id(const nlohmann::json& resolved);
// JSON Schema (draft 2020-12) of an experiment config. Keys of the model, data and optimizer
// sections say which types read them in "x-applies-to".
nlohmann::json experiment_schema();
// A relative path resolved against base_dir (the folder of the config file).
std::filesystem::path resolve_path(const std::string& p, const std::filesystem::path& base_dir);

// Sweep: {"base": {...}} or {"base_file": "..."}, plus "grid": {"dotted.key": [values...]}
// (every combination) and/or "points": [{"dotted.key": value, ...}, ...] (each grid combination
// is applied on top of each point), "lr_search": [lr, ...] (every point/grid combination at each
// learning rate; a point may carry its own "lr_search") and "repeat": N (each of those at seeds
// s, s+1, ..., s+N-1, s the combination's seed). Expanded in that order; the configs equal those
// of an explicit grid over optimizer.lr and seed, so their run ids (and files) are the same.
struct SweepPoint {
  nlohmann::json config;  // the base with this point's values set
  std::vector<std::pair<std::string, nlohmann::json>> assignment;
};
std::vector<SweepPoint> expand_sweep(const nlohmann::json& sweep, const std::filesystem::path& base_dir);

}  // namespace scape::config
