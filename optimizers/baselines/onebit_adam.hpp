// Baseline: 1-bit Adam (Tang et al. 2021). Dense AdamW for freeze_step steps; then the
// variance is frozen and each worker's momentum, with its error feedback, travels as one sign
// bit per coordinate and one scale per sign_chunk coordinates: a compressed reduce-scatter
// (all-to-all) to each shard's owner, which averages, adds its server error and compresses
// again, and a compressed all-gather (docs/algorithms.md, "1-bit Adam").
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/optimizer_base.hpp"
#include "optimizers/baselines/onebit_adam_config.hpp"

namespace scape {

class OnebitAdamOptimizer final : public OptimizerBase {
 public:
  OnebitAdamOptimizer(const CommonOptimizerConfig& config, const OnebitAdamSwitches& onebit, const ParamLayout& layout,
                      Communicator& comm, int total_steps);
  // The worker error e_i of the momentum compression.
  std::span<const float> residual() const override { return worker_error_.span(); }

 private:
  const OnebitAdamSwitches onebit_;

  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;

  // One segment per shard: its sign words, then its scales.
  struct Segment {
    std::size_t begin, size;  // the shard's coordinates
    std::size_t scales, scale_offset, bytes, byte_offset;
  };

  void warmup_step(std::span<float> params, std::span<const float> grads, double eta);
  // Compresses x (the coordinates of segment s) in place: the scales sqrt(sum x^2 / |chunk|)
  // and sign bits go to words_/scales_ at the segment's place, and x keeps the error.
  void compress(std::span<float> x, const Segment& s);
  // Copies segment s's words and scales between words_/scales_ and a wire buffer.
  void pack(const Segment& s, std::byte* wire) const;
  void unpack(const Segment& s, const std::byte* wire);
  // acc += the decompressed segment s (from words_/scales_).
  void expand_add(const Segment& s, std::span<float> acc);
  // The synchronized momentum of this step: worker compression, exchange, server compression,
  // gather; into m_sync_.
  void synchronize_momentum(std::span<const float> grads);
  // theta *= decay, then theta -= lr (m / c1) / (sqrt(v / c2_F) + eps) with m = m_sync_.
  void frozen_variance_step(std::span<float> params, double eta, int t);

  std::vector<Segment> segments_;
  std::vector<std::size_t> segment_bytes_;
  kernels::Buffer<float> worker_error_{kernels_}, server_error_{kernels_};  // e_i over [0, N); e_s over this shard
  kernels::Buffer<float> local_{kernels_}, m_sync_{kernels_}, acc_{kernels_}, g_bar_{kernels_};
  kernels::Buffer<std::uint64_t> words_{kernels_};
  kernels::Buffer<float> scales_{kernels_};
  kernels::Buffer<double> partial_{kernels_};
  std::vector<std::byte> send_, recv_, gathered_;
};

}  // namespace scape
