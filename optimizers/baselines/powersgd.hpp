// Baseline: PowerSGD (Vogels et al. 2019). Each matrix-shaped gradient tensor M (error
// feedback added) is compressed to rank r by one power iteration with a warm-started Q kept
// across steps: P = M Q all-reduced, orthonormalised, Q = M^T P all-reduced, P Q^T delivered
// and M - P Q^T kept as the error; vectors (biases, norms) are all-reduced dense. The inner
// AdamW or AdamS runs on the decompressed mean gradient (docs/algorithms.md, "PowerSGD").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/optimizer_base.hpp"
#include "optimizers/baselines/powersgd_config.hpp"

namespace scape {

// Which tensors PowerSGD factorises and where their factors live, from the layout alone (so
// the volume model and the optimizer agree): a tensor of two or more dimensions is a matrix
// of shape[0] rows and numel / shape[0] columns, factorised at rank min(r, rows, cols); a
// one-dimensional tensor travels dense.
struct PowersgdPlan {
  struct Matrix {
    std::size_t offset, rows, cols, rank;  // in the flat buffer
    std::size_t p_offset, q_offset;        // in the packed P and Q buffers
  };
  struct Vector {
    std::size_t offset, size, packed_offset;  // in the flat buffer and the packed vector buffer
  };
  std::vector<Matrix> matrices;
  std::vector<Vector> vectors;
  std::size_t p_size = 0, q_size = 0, vector_size = 0;  // sum r'(rows), sum r'(cols), sum |vector|
};
PowersgdPlan powersgd_plan(const ParamLayout& layout, int rank);

class PowersgdOptimizer final : public OptimizerBase {
 public:
  PowersgdOptimizer(const CommonOptimizerConfig& config, const PowersgdSwitches& powersgd, const ParamLayout& layout,
                    Communicator& comm, int total_steps);
  // The error-feedback residual e_i over [0, N) (zero on the vectors, which travel whole).
  std::span<const float> residual() const override { return error_.span(); }

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;
  // P = M Q for every matrix, all-reduced and orthonormalised; then Q = M^T P all-reduced.
  void power_iteration();
  // Packs the vectors' gradients, all-reduces them and places the mean into g_bar_.
  void reduce_vectors(std::span<const float> grads);

  const PowersgdPlan plan_;
  kernels::Buffer<float> error_{kernels_};  // e_i, then M = e_i + g_i during a step
  kernels::Buffer<float> p_{kernels_}, q_{kernels_};  // every matrix's factors, packed; q_ is the warm start
  kernels::Buffer<float> vectors_{kernels_}, g_bar_{kernels_};
};

}  // namespace scape
