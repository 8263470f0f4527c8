// scape._core.Transport (a Python process group, subclassed in Python through a nanobind
// trampoline) and scape._core.SteppedRank (runtime/stepped_rank.hpp) over it.
#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include "arrays.hpp"
#include "run_setup.hpp"
#include "runtime/stepped_rank.hpp"

namespace scape::python {
namespace {

std::vector<std::size_t> to_vector(std::span<const std::size_t> v) { return {v.begin(), v.end()}; }

// Runs a Python hook with the GIL held; a Python exception becomes a C++ one before the GIL goes.
template <class F>
int held(F&& f) {
  nb::gil_scoped_acquire gil;
  try {
    return f();
  } catch (const nb::python_error& e) {
    throw std::runtime_error(std::string("transport: ") + e.what());
  }
}

// The C++ transport with Python-shaped hooks: buffers cross as numpy views (valid for the call),
// counts as lists. The stepping thread has released the GIL; each hook takes it, and a Python
// exception becomes a C++ one while the GIL is held (a peer gone, a timeout).
class PyTransport : public runtime::CollectiveTransport {
 public:
  virtual int py_rank() const = 0;
  virtual int py_size() const = 0;
  virtual void py_all_gather(nb::object send, nb::object recv, std::vector<std::size_t> counts) = 0;
  virtual void py_all_to_all(nb::object send, std::vector<std::size_t> send_counts, nb::object recv,
                             std::vector<std::size_t> recv_counts) = 0;
  virtual void py_all_reduce_sum(nb::object data) = 0;
  virtual void py_barrier() = 0;

  int rank() const override {
    return held([&] { return py_rank(); });
  }
  int size() const override {
    return held([&] { return py_size(); });
  }
  void all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                        std::span<const std::size_t> counts) override {
    held([&] {
      py_all_gather(byte_view(writable(send)), byte_view(recv), to_vector(counts));
      return 0;
    });
  }
  void all_to_all_bytes(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                        std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    held([&] {
      py_all_to_all(byte_view(writable(send)), to_vector(send_counts), byte_view(recv), to_vector(recv_counts));
      return 0;
    });
  }
  void all_reduce_sum(std::span<float> data) override {
    held([&] {
      py_all_reduce_sum(float_view_for_call(data));
      return 0;
    });
  }
  void barrier() override {
    held([&] {
      py_barrier();
      return 0;
    });
  }

 private:
  // The send buffer is handed to Python writable so torch.from_numpy takes it without a
  // warning; the transport only reads it.
  static std::span<std::byte> writable(std::span<const std::byte> s) {
    return {const_cast<std::byte*>(s.data()), s.size()};
  }
};

class PyTransportTrampoline : public PyTransport {
 public:
  NB_TRAMPOLINE(PyTransport);
  int py_rank() const override { NB_OVERRIDE_PURE_NAME("rank", py_rank); }
  int py_size() const override { NB_OVERRIDE_PURE_NAME("size", py_size); }
  void py_all_gather(nb::object send, nb::object recv, std::vector<std::size_t> counts) override {
    NB_OVERRIDE_PURE_NAME("all_gather", py_all_gather, send, recv, counts);
  }
  void py_all_to_all(nb::object send, std::vector<std::size_t> send_counts, nb::object recv,
                     std::vector<std::size_t> recv_counts) override {
    NB_OVERRIDE_PURE_NAME("all_to_all", py_all_to_all, send, send_counts, recv, recv_counts);
  }
  void py_all_reduce_sum(nb::object data) override { NB_OVERRIDE_PURE_NAME("all_reduce_sum", py_all_reduce_sum, data); }
  void py_barrier() override { NB_OVERRIDE_PURE_NAME("barrier", py_barrier); }
};

struct RankHandle {
  std::unique_ptr<runtime::SteppedRank> rank;
  nb::object transport;  // kept alive as long as the rank
};

}  // namespace

void bind_distributed(nb::module_& m) {
  nb::class_<PyTransport, PyTransportTrampoline>(
      m, "Transport",
      "A process group the optimizer core communicates through: subclass it and define rank(), size(), "
      "all_gather(send, recv, counts), all_to_all(send, send_counts, recv, recv_counts), all_reduce_sum(data) and "
      "barrier() over uint8 (float32 for all_reduce_sum) numpy views valid for the call "
      "(scape.torch.TorchTransport does it with torch.distributed).")
      .def(nb::init<>());

  nb::class_<RankHandle>(m, "SteppedRank", "One torchrun rank stepping the optimizer core (scape.torch wraps it).")
      .def(
          "__init__",
          [](RankHandle* self, const std::string& config_json, const std::vector<TensorSpec>& layout,
             const nb::object& params, nb::object transport, bool deterministic, const std::string& log, bool quiet,
             double tokens_per_step) {
            experiments::ExperimentConfig config = parse_config(config_json);
            auto data = external_data(layout, params, nb::none());
            train::RunOptions options = run_options(log, quiet, tokens_per_step);
            auto& t = nb::cast<PyTransport&>(transport);
            std::unique_ptr<runtime::SteppedRank> rank;
            {
              nb::gil_scoped_release release;
              rank = std::make_unique<runtime::SteppedRank>(std::move(config), std::move(data), options, t,
                                                            deterministic);
            }
            new (self) RankHandle{std::move(rank), transport};
          },
          nb::arg("config_json"), nb::arg("layout"), nb::arg("params").none(), nb::arg("transport"),
          nb::arg("deterministic"), nb::arg("log"), nb::arg("quiet"), nb::arg("tokens_per_step"))
      .def(
          "step",
          [](RankHandle& self, const nb::ndarray<>& grads, double loss, double compute_seconds) {
            const auto g = float_span(grads, "grads", self.rank->size());
            nb::gil_scoped_release release;
            return self.rank->step(g, loss, compute_seconds);
          },
          nb::arg("grads"), nb::arg("loss"), nb::arg("compute_seconds"))
      .def_prop_ro("params", [](nb::handle self) {
        auto p = nb::cast<RankHandle&>(self).rank->params();
        // Writable: the model's parameters are views of it (scape.torch); only the optimizer writes.
        static float empty = 0;
        const std::size_t shape[1] = {p.size()};
        nb::ndarray<nb::numpy, float, nb::ndim<1>> a(p.empty() ? &empty : const_cast<float*>(p.data()), 1, shape, self);
        return nb::cast(a, nb::rv_policy::reference);
      })
      .def_prop_ro("mask", [](nb::handle self) { return word_view(nb::cast<RankHandle&>(self).rank->mask(), self); })
      .def_prop_ro("residual",
                   [](nb::handle self) { return float_view(nb::cast<RankHandle&>(self).rank->residual(), self); })
      .def("last_row", [](RankHandle& self) { return row_dict(self.rank->last_row()); })
      .def(
          "close", [](RankHandle& self, const std::string& failure) { return close_released(*self.rank, failure); },
          nb::arg("failure") = "")
      .def("abort", [](RankHandle& self, const std::string& failure) { self.rank->abort(failure); },
           nb::arg("failure"), "Ends this rank's part at once as failed; not collective.")
      .def_prop_ro("rank", [](RankHandle& self) { return self.rank->rank(); })
      .def_prop_ro("size", [](RankHandle& self) { return self.rank->size(); })
      .def_prop_ro("steps_done", [](RankHandle& self) { return self.rank->steps_done(); });
}

}  // namespace scape::python
