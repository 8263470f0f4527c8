// Baseline: SparseLoCo (Sarfi et al. 2025, arXiv 2508.15706; Templar's code). DiLoCo's outer
// loop without outer momentum: every H steps each worker adds its pseudo-gradient to an
// error-feedback accumulator, e_i <- ef_decay e_i + Delta_i, sends the top-k entries of every
// chunk of each tensor of e_i with their values quantized (sparseloco_codec.hpp) and keeps what it
// did not deliver in e_i; the workers all-gather the messages, average the delivered values and
// step theta_global -= outer_lr mean (docs/algorithms.md, "SparseLoCo").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optimizers/baselines/outer_loop.hpp"
#include "optimizers/baselines/sparseloco_codec.hpp"

namespace scape {

class SparselocoOptimizer final : public OuterLoopOptimizer {
 public:
  SparselocoOptimizer(const CommonOptimizerConfig& config, const OuterLoopSwitches& outer,
                      const SparselocoSwitches& sparseloco, const ParamLayout& layout, Communicator& comm,
                      int total_steps);
  // The error-feedback accumulator e_i.
  std::span<const float> residual() const override { return error_.span(); }

 private:
  void outer_step(std::span<const float> params, std::size_t lo, std::size_t hi, StepMetrics& out) override;
  // The top-k of every chunk of every tensor of e_i: global positions (ascending) into idx_ and
  // values into selected_.
  void select();
  // This worker's message from idx_ and selected_.
  void encode(std::byte* message);
  // A message's positions and delivered values.
  void decode(const std::byte* message, std::span<std::uint32_t> idx, std::span<float> values);

  const SparselocoSwitches sparseloco_;
  const SparselocoPlan plan_;
  kernels::Buffer<float> error_{kernels_};  // e_i over [0, N)
  kernels::Buffer<float> delta_{kernels_}, mean_{kernels_};
  kernels::Buffer<std::uint32_t> idx_{kernels_}, recv_idx_{kernels_};
  kernels::Buffer<float> selected_{kernels_}, recv_values_{kernels_};
  kernels::Buffer<std::uint64_t> positions_{kernels_}, code_{kernels_};  // Elias-Fano coding
  kernels::Buffer<double> norm_partial_{kernels_};
  std::vector<std::byte> send_, recv_;
};

}  // namespace scape
