// Baseline: DeMo (Peng et al. 2024, "Decoupled Momentum Optimization"). Each worker keeps its
// own momentum m <- beta1 m + g, takes an orthonormal DCT-II of every demo_chunk coordinates of
// it, extracts the demo_topk largest coefficients of each chunk (removing them from m) and
// all-gathers them, Elias-Fano coded; every worker averages the gathered coefficients, inverts
// the DCT and steps by lr times the sign, with decoupled weight decay (docs/algorithms.md,
// "DeMo").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/optimizer_base.hpp"
#include "optimizers/baselines/deco_momentum_config.hpp"

namespace scape {

// The orthonormal DCT-II matrix of length `len`, row f = frequency: sqrt(c_f / len)
// cos(pi (2 j + 1) f / (2 len)), c_0 = 1, c_f = 2; computed in double, rounded once.
std::vector<float> dct_basis(std::size_t len);

class DecoMomentumOptimizer final : public OptimizerBase {
 public:
  DecoMomentumOptimizer(const CommonOptimizerConfig& config, const DecoMomentumSwitches& demo,
                        const ParamLayout& layout, Communicator& comm, int total_steps);

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;
  // out = the chunked DCT of x (inverse: its transpose), the short last chunk by its own basis.
  void transform(std::span<const float> x, bool inverse, std::span<float> out);
  // Extracts the top coefficients of the momentum into idx_ / values_ and removes them from m.
  void extract();
  // The all-gather of every worker's coefficients; their mean, in rank order, into coeffs_.
  void exchange();

  const DecoMomentumSwitches demo_;
  const std::size_t chunk_, tail_, entries_;  // chunk, the short last chunk (0: none), K per worker
  kernels::Buffer<float> basis_{kernels_}, tail_basis_{kernels_};
  // coeffs_: DCT coefficients (the momentum's, the extracted ones, then the mean); removed_:
  // an inverse DCT (of the extracted part, then of the mean: the update direction).
  kernels::Buffer<float> coeffs_{kernels_}, removed_{kernels_};
  kernels::Buffer<std::uint32_t> idx_{kernels_}, recv_idx_{kernels_};
  kernels::Buffer<float> values_{kernels_}, recv_values_{kernels_};
  kernels::Buffer<std::uint64_t> positions_{kernels_}, code_{kernels_};
  std::vector<std::byte> send_, recv_;
};

}  // namespace scape
