// The switches of the local-SGD methods (docs/algorithms.md, "DiLoCo" and "SparseLoCo"): the
// outer loop DiLoCo and SparseLoCo share, and each one's own.
#pragma once

#include <cstddef>
#include <span>

#include "core/communicator.hpp"
#include "core/optimizer_config.hpp"

namespace scape {

// Each worker takes inner_steps = H steps of its own AdamW or AdamS (`inner`), then the workers
// exchange their pseudo-gradients and take one outer step.
struct OuterLoopSwitches {
  int inner_steps = 10;
  double outer_lr = -1.0;  // negative: the method's default (kDilocoOuterLr, kSparselocoOuterLr)
  // DiLoCoX's one-step delay: the outer step's result is applied one inner step later, so that its
  // collective overlaps that step's compute.
  bool overlap_outer = false;

  double resolved_outer_lr(double method_default) const { return outer_lr >= 0 ? outer_lr : method_default; }
};

// The default outer learning rates: the DiLoCo paper's, and Templar's outer_learning_rate for
// SparseLoCo (docs/algorithms.md, "SparseLoCo").
inline constexpr double kDilocoOuterLr = 0.7;
inline constexpr double kSparselocoOuterLr = 0.9;

// DiLoCo's outer Nesterov momentum, the wire of its pseudo-gradient all-reduce, and Streaming
// DiLoCo's fragments (F contiguous parts of the flat buffer, one synced every H / F steps).
struct DilocoSwitches {
  double outer_momentum = 0.9;
  WireType outer_wire = WireType::fp32;
  int streaming_fragments = 1;
};

// SparseLoCo: the coordinates of a tensor that share one top-k (`sparsity` sets the density), the
// bits of each sent value (0: the value at wire_dtype) and the error-feedback decay beta.
struct SparselocoSwitches {
  std::size_t chunk = 4096;
  int quant_bits = 2;
  double ef_decay = 0.999;
};

// The ranges of the outer loop's, DiLoCo's and SparseLoCo's numeric switches.
std::span<const OptimizerKeyRange> outer_loop_key_ranges();
// The checks of each; throw std::invalid_argument naming the first offending key.
void validate_outer_loop_switches(const OuterLoopSwitches& outer, double method_default_outer_lr);
void validate_diloco_switches(const OuterLoopSwitches& outer, const DilocoSwitches& diloco);
void validate_sparseloco_switches(const CommonOptimizerConfig& common, const SparselocoSwitches& sparseloco);

}  // namespace scape
