// scape._core.Simulator: the stepped simulator (sim/stepped_simulator.hpp) over Python arrays.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "arrays.hpp"
#include "run_setup.hpp"
#include "sim/stepped_simulator.hpp"

namespace scape::python {
namespace {

// The W gradients of a step as spans: a list of W flat arrays, or one [W, N] array.
std::vector<std::span<const float>> worker_gradients(const nb::object& grads, std::size_t workers, std::size_t n) {
  std::vector<std::span<const float>> out;
  if (nb::isinstance<nb::list>(grads) || nb::isinstance<nb::tuple>(grads)) {
    const std::size_t given = nb::len(grads);
    if (given != workers) {
      throw nb::value_error(("grads: " + std::to_string(given) + " gradients for " + std::to_string(workers) +
                             " workers")
                                .c_str());
    }
    for (std::size_t w = 0; w < workers; ++w) {
      nb::ndarray<> a;
      if (!nb::try_cast(grads[w], a)) {
        throw nb::value_error(
            ("grads[" + std::to_string(w) + "]: not an array (a torch tensor or numpy array)").c_str());
      }
      out.push_back(float_span(a, "grads[" + std::to_string(w) + "]", n));
    }
    return out;
  }
  nb::ndarray<> a;
  if (!nb::try_cast(grads, a)) {
    throw nb::value_error("grads: a list of W flat arrays or one [W, N] array, got another type");
  }
  check_float_matrix(a, "grads", workers, n);
  for (std::size_t w = 0; w < workers; ++w) out.push_back(float_row(a, w, n));
  return out;
}

// W floats (losses, seconds) or none.
std::vector<double> per_worker_values(const nb::object& values, const char* argument, std::size_t workers) {
  if (values.is_none()) return {};
  std::vector<double> out;
  if (!nb::try_cast(values, out)) throw nb::value_error((std::string(argument) + ": a list of floats").c_str());
  if (out.size() != workers) {
    throw nb::value_error((std::string(argument) + ": " + std::to_string(out.size()) + " values for " +
                           std::to_string(workers) + " workers")
                              .c_str());
  }
  return out;
}

// The Python object's C++ state.
struct SimulatorHandle {
  std::unique_ptr<sim::SteppedSimulator> sim;
};

}  // namespace

void bind_simulator(nb::module_& m) {
  nb::class_<SimulatorHandle>(m, "Simulator",
                              "W emulated workers stepping the optimizer core on caller-supplied gradients "
                              "(scape.Simulator wraps it).")
      .def(
          "__init__",
          [](SimulatorHandle* self, const std::string& config_json, const std::vector<TensorSpec>& layout,
             const nb::object& params, const std::string& log, bool quiet, double tokens_per_step,
             const nb::object& validation) {
            config::ExperimentConfig config = parse_config(config_json);
            auto data = external_data(layout, params, validation);
            train::RunOptions options = run_options(log, quiet, tokens_per_step);
            std::unique_ptr<sim::SteppedSimulator> sim;
            try {
              sim = std::make_unique<sim::SteppedSimulator>(std::move(config), std::move(data), options);
            } catch (const config::ConfigError& e) {
              throw nb::value_error(e.what());
            }
            new (self) SimulatorHandle{std::move(sim)};
          },
          nb::arg("config_json"), nb::arg("layout"), nb::arg("params").none(), nb::arg("log"), nb::arg("quiet"),
          nb::arg("tokens_per_step"), nb::arg("validation").none())
      .def(
          "step",
          [](SimulatorHandle& self, const nb::object& grads, const nb::object& losses,
             const nb::object& compute_seconds) {
            auto& sim = *self.sim;
            const auto spans = worker_gradients(grads, static_cast<std::size_t>(sim.workers()), sim.size());
            const std::vector<double> loss_values = per_worker_values(losses, "losses", spans.size());
            const std::vector<double> compute = per_worker_values(compute_seconds, "compute_seconds", spans.size());
            nb::gil_scoped_release release;
            return sim.step(spans, loss_values, compute);
          },
          nb::arg("grads"), nb::arg("losses").none() = nb::none(), nb::arg("compute_seconds").none() = nb::none(),
          "One step on the W workers' gradients; True when the run diverged.")
      .def(
          "step_repeated",
          [](SimulatorHandle& self, const nb::object& grads, int count) {
            auto& sim = *self.sim;
            const auto spans = worker_gradients(grads, static_cast<std::size_t>(sim.workers()), sim.size());
            nb::gil_scoped_release release;
            const auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < count; ++i) (void)sim.step(spans, {});
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          },
          nb::arg("grads"), nb::arg("count"),
          "`count` steps on the same gradients inside C++, returning their wall seconds: the core's own step "
          "time, without this binding, for the overhead benchmark (python/bench).")
      .def_prop_ro("params",
                   [](nb::handle self) { return float_view(nb::cast<SimulatorHandle&>(self).sim->params(), self); })
      .def_prop_ro("mask",
                   [](nb::handle self) { return word_view(nb::cast<SimulatorHandle&>(self).sim->mask(), self); })
      .def("residual",
           [](nb::handle self, int worker) {
             try {
               return float_view(nb::cast<SimulatorHandle&>(self).sim->residual(worker), self);
             } catch (const std::out_of_range& e) {
               throw nb::value_error(e.what());
             }
           })
      .def("last_row", [](SimulatorHandle& self) { return row_dict(self.sim->last_row()); })
      .def(
          "close", [](SimulatorHandle& self, const std::string& failure) { return close_released(*self.sim, failure); },
          nb::arg("failure") = "")
      .def_prop_ro("closed", [](SimulatorHandle& self) { return self.sim->closed(); })
      .def_prop_ro("workers", [](SimulatorHandle& self) { return self.sim->workers(); })
      .def_prop_ro("size", [](SimulatorHandle& self) { return self.sim->size(); })
      .def_prop_ro("steps_done", [](SimulatorHandle& self) { return self.sim->steps_done(); })
      .def_prop_ro("total_steps", [](SimulatorHandle& self) { return self.sim->total_steps(); })
      .def_prop_ro("config_json", [](SimulatorHandle& self) { return self.sim->config().to_json().dump(); });
}

}  // namespace scape::python
