// Config, layout, options and results across the binding.
#include "run_setup.hpp"

#include <stdexcept>

#include <nanobind/stl/string.h>

#include "arrays.hpp"

// Generated at every build by cmake/git_sha.cmake, as for the scape command.
const char* scape_git_sha();

namespace scape::python {

config::ExperimentConfig parse_config(const std::string& config_json) {
  try {
    return config::parse_experiment(nlohmann::json::parse(config_json), std::filesystem::current_path());
  } catch (const config::ConfigError& e) {
    throw nb::value_error(e.what());
  } catch (const nlohmann::json::exception& e) {
    throw nb::value_error((std::string("config: ") + e.what()).c_str());
  }
}

std::unique_ptr<train::ExternalData> external_data(const std::vector<TensorSpec>& tensors, const nb::object& params,
                                                   const nb::object& validation) {
  ParamLayout layout;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, shape, decay] = tensors[i];
    try {
      layout.add(name, shape, decay);
    } catch (const std::invalid_argument& e) {
      throw nb::value_error(("layout[" + std::to_string(i) + "]: " + e.what()).c_str());
    }
  }
  if (layout.size() == 0) throw nb::value_error("layout: no tensors");
  std::vector<float> init(layout.size(), 0.0f);
  if (!params.is_none()) {
    const auto a = nb::cast<nb::ndarray<>>(params);
    const auto values = float_span(a, "params", layout.size());
    init.assign(values.begin(), values.end());
  }
  train::ExternalData::Validation validate;
  if (!validation.is_none()) {
    // Called on rank 0's thread while the stepping thread has released the GIL.
    validate = [fn = nb::borrow<nb::callable>(validation)](std::span<const float> p) -> double {
      nb::gil_scoped_acquire gil;
      try {
        return nb::cast<double>(fn(float_view(p, nb::handle())));
      } catch (const nb::python_error& e) {
        throw std::runtime_error(std::string("eval: ") + e.what());
      } catch (const nb::cast_error&) {
        throw std::runtime_error("eval: the validation callback must return a float");
      }
    };
  }
  return std::make_unique<train::ExternalData>(std::move(layout), std::move(init), std::move(validate));
}

train::RunOptions run_options(const std::string& log, bool quiet, double tokens_per_step) {
  train::RunOptions o;
  o.out = log;
  o.quiet = quiet;
  o.tokens_per_step = tokens_per_step;
  o.scape_version = SCAPE_VERSION;
  o.git_sha = scape_git_sha();
  return o;
}

nb::dict row_dict(const std::vector<std::pair<std::string, double>>& row) {
  nb::dict d;
  for (const auto& [name, value] : row) d[name.c_str()] = value;
  return d;
}

nb::dict outcome_dict(const train::RunOutcome& o) {
  nb::dict d;
  d["status"] = train::to_string(o.status);
  d["error"] = o.error;
  d["steps_completed"] = o.steps_completed;
  d["final_val_loss"] = o.final_val_loss;
  d["final_train_loss"] = o.final_train_loss;
  d["bytes_per_step"] = o.bytes_per_step;
  d["mean_mask_jaccard"] = o.mean_mask_jaccard;
  d["step_time_model"] = o.step_time_model;
  d["n_params"] = o.n_params;
  return d;
}

}  // namespace scape::python
