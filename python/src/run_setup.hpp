// What the simulator binding builds from Python's arguments: the experiment config (parsed and
// validated by the same code as a run config file, so errors read the same) and the layout.
#pragma once

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "config/config.hpp"
#include "train/gradient_source.hpp"
#include "train/run_log.hpp"

namespace scape::python {

namespace nb = nanobind;

// One tensor of the layout as Python gives it: (name, shape, decay).
using TensorSpec = std::tuple<std::string, std::vector<std::size_t>, bool>;

// Parses the config JSON; a ConfigError or a JSON error becomes ValueError with its text.
config::ExperimentConfig parse_config(const std::string& config_json);
// The layout and the initial parameters (`params`: N float32 values, or None for zeros), and
// the validation callback (None: no validation), wrapped to hold the GIL and to turn a Python
// exception into a C++ one.
std::unique_ptr<train::ExternalData> external_data(const std::vector<TensorSpec>& tensors,
                                                   const nb::object& params, const nb::object& validation);
// Run options: the run file, the progress line, and the version this module was built from.
train::RunOptions run_options(const std::string& log, bool quiet, double tokens_per_step);
// The row as a dict, and the outcome as a dict (status, error, steps, final losses, bytes).
nb::dict row_dict(const std::vector<std::pair<std::string, double>>& row);
nb::dict outcome_dict(const train::RunOutcome& outcome);
// runner.close(failure) with the GIL released (it joins the ranks and writes the file), as a dict.
template <class Runner>
nb::dict close_released(Runner& runner, const std::string& failure) {
  train::RunOutcome outcome;
  {
    nb::gil_scoped_release release;
    outcome = runner.close(failure);
  }
  return outcome_dict(outcome);
}

}  // namespace scape::python
