// The scape._core extension: the optimizer core's stepped simulator for Python. Every number
// comes from the C++ core; this layer only checks arrays and moves the GIL.
#include <nanobind/nanobind.h>

#include <nanobind/ndarray.h>

#include "kernels/backend.hpp"
#include "model/data.hpp"

namespace scape::python {
void bind_simulator(nanobind::module_& m);
}  // namespace scape::python

NB_MODULE(_core, m) {
  m.doc() = "scape's optimizer core (C++): the stepped simulator";
  scape::python::bind_simulator(m);
  m.def("cuda_built", &scape::kernels::cuda_built, "Whether this build has the CUDA path.");
  // The built-in Markov corpus of data.type "synthetic" (model/data.hpp), for Python training
  // loops that want the same tokens as `scape run`.
  m.def(
      "synthetic_corpus",
      [](int vocab_size, int successors, double concentration, std::uint64_t seed, std::size_t tokens,
         double val_fraction) {
        scape::model::MarkovConfig mc;
        mc.vocab_size = vocab_size;
        mc.successors = successors;
        mc.concentration = concentration;
        mc.seed = seed;
        scape::model::TokenSplit split;
        try {
          split = scape::model::synthetic_corpus(mc, tokens, val_fraction);
        } catch (const std::invalid_argument& e) {
          throw nanobind::value_error(e.what());
        }
        auto to_array = [](const scape::model::Tokens& t) {
          auto* copy = new std::vector<std::uint16_t>(t.begin(), t.end());
          nanobind::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<std::uint16_t>*>(p); });
          const std::size_t shape[1] = {copy->size()};
          return nanobind::ndarray<nanobind::numpy, std::uint16_t, nanobind::ndim<1>>(copy->data(), 1, shape, owner);
        };
        return nanobind::make_tuple(to_array(split.train), to_array(split.val));
      },
      nanobind::arg("vocab_size"), nanobind::arg("successors"), nanobind::arg("concentration"), nanobind::arg("seed"),
      nanobind::arg("tokens"), nanobind::arg("val_fraction"),
      "(train, val) uint16 token arrays of the synthetic Markov corpus, as data.type \"synthetic\" makes them.");
  m.attr("version") = SCAPE_VERSION;
}
