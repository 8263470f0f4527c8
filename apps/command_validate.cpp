// scape validate: a config with every default filled in, its host memory estimate (and its GPU
// memory estimate), or every point of a sweep; a config past the machine's available memory is
// refused as scape run refuses it.
#include <cstdio>
#include <iostream>

#include "apps/cli_common.hpp"
#include "config/sweep_plan.hpp"
#include "train/device_memory.hpp"
#include "train/host_memory.hpp"

namespace scape::cli {
namespace {

using nlohmann::json;

// The workers one process of `scape run --backend B` holds: all of them in the simulator.
int workers_in_process(const cfg::ExperimentConfig& config, const std::string& backend) {
  return backend == "sim" ? config.workers : 1;
}

int cmd_validate(const std::string& file, const std::vector<std::string>& sets, const std::string& backend,
                 bool force_memory) {
  json j = cfg::read_json_file(file);
  // A sweep has its base (base or base_file); a config that has a model section and a stray
  // sweep key is a config with an unknown key, named as scape run names it.
  const bool sweep_keys = j.is_object() && (j.contains("grid") || j.contains("points") || j.contains("repeat") ||
                                            j.contains("lr_search"));
  if (sweep_keys && (j.contains("base") || j.contains("base_file") || !j.contains("model"))) {
    // A sweep: every point must be a valid experiment.
    const auto base_dir = std::filesystem::absolute(file).parent_path();
    auto points = cfg::expand_sweep(j, base_dir);
    int invalid = 0;
    for (auto& p : points) {
      try {
        for (const auto& s : sets) cfg::apply_override(p.config, s);
        cfg::apply_backend_defaults(p.config, backend);
        const auto config = cfg::parse_experiment(p.config, base_dir);
        cfg::check_backend(config, backend);
        if (backend == "sim") check_host_memory(config, config.workers, force_memory);
        std::printf("valid    %s  (run id %s)\n", cfg::point_label(p).c_str(), cfg::run_id(config.to_json()).c_str());
      } catch (const cfg::ConfigError& e) {
        ++invalid;
        std::printf("invalid  %s: %s\n", cfg::point_label(p).c_str(), e.what());
      }
    }
    std::fprintf(stderr, "%s: sweep of %zu points, %d invalid\n", file.c_str(), points.size(), invalid);
    return invalid ? kExitInvalid : kExitOk;
  }
  const auto config = load_config(file, sets, backend);
  const auto host = tr::host_memory_estimate(config, workers_in_process(config, backend));
  const std::size_t available = tr::available_host_memory();
  std::fprintf(stderr, "%s\n  machine      %12s available (MemAvailable)\n", tr::describe(host).c_str(),
               available ? tr::format_bytes(static_cast<double>(available)).c_str() : "unknown");
  if (backend == "sim" && !force_memory) tr::require_host_memory(host, available);
  std::cout << config.to_json().dump(2) << "\n";
  std::fprintf(stderr, "%s: valid (run id %s)\n", file.c_str(), cfg::run_id(config.to_json()).c_str());
  if (config.device == scape::kernels::DeviceKind::cuda) {
    std::fprintf(stderr, "device memory estimate (simulator, one GPU): %s\n",
                 scape::train::describe(scape::train::device_memory_estimate(config, config.workers, true)).c_str());
  }
  return kExitOk;
}

struct ValidateArgs {
  std::string config_file;
  std::vector<std::string> sets;
  std::string backend = "sim";
  bool force_memory = false;
};

}  // namespace

Command add_validate_command(CLI::App& app) {
  const auto a = std::make_shared<ValidateArgs>();
  auto* validate = app.add_subcommand(
      "validate",
      "check a config (print it with every default filled in, its host memory estimate by part; with device = cuda, "
      "its GPU memory estimate) or every point of a sweep");
  validate->add_option("config", a->config_file, "experiment or sweep JSON file")->required()->check(CLI::ExistingPath);
  validate->add_option("--set", a->sets, "override a config value: key.path=value (JSON, else a string); repeatable");
  // The defaults of log.oracle and log.gradient_metrics_interval depend on the backend
  // (docs/configuration.md): the printed config is the one `scape run --backend B` records.
  validate->add_option("--backend", a->backend,
                       "resolve the defaults as scape run --backend does (mpi, nccl: log.oracle false, "
                       "log.gradient_metrics_interval 100 unless given)")
      ->check(CLI::IsMember({"sim", "mpi", "nccl"}))
      ->capture_default_str();
  add_force_memory_flag(validate, a->force_memory);
  Command c;
  c.sub = validate;
  c.run = [a] { return cmd_validate(a->config_file, a->sets, a->backend, a->force_memory); };
  return c;
}

}  // namespace scape::cli
