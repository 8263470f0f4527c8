// What configures an optimizer: the type, the update rule, the hyper-parameters and each
// method's switches, their names and ranges, and the checks that reject an inconsistent
// combination (docs/algorithms.md, "Switches"; the JSON keys are config/config_keys.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/communicator.hpp"
#include "core/schedule.hpp"
#include "kernels/backend.hpp"

namespace scape {


enum class OptimizerType { adamw, adams, scape, topk_ef, randk_ef, onebit_adam, powersgd, demo, diloco, sparseloco };
enum class InnerRule { adams, adamw };
enum class UpdateMode { masked, dense };
enum class MaskStatistic { first_moment, gradient, momentum_only, random };
enum class MaskPartition { partitioned, local_union };
enum class SecondMoment { single_buffer, two_collectives };
// How SCAPE's partitioned mask crosses the wire (docs/algorithms.md, "Mask coding"); "auto"
// picks per step and shard the smallest of the other three.
enum class MaskEncoding { bitmap, elias_fano, delta, auto_select };
// SCAPE's algorithm (docs/algorithms.md, "SCAPE"): the authors' as their artifact computes it
// (paper), the artifact's code with its two quirks (artifact), or this project's earlier
// specification with the residual in gradient units and m frozen off the mask (frozen_momentum).
enum class Formulation { paper, artifact, frozen_momentum };
// Where SCAPE counts k: per parameter tensor (or its fragment in a shard), or per whole shard.
enum class MaskScope { tensor, shard };
// Where AdamS's bias corrections sit: on v and m as the artifact's AdamS.py (artifact), or on
// m_prev inside the root (momentum_corrected); automatic resolves per optimizer
// (OptimizerConfig::resolved_adams_form).
enum class AdamsForm { automatic, artifact, momentum_corrected };

// Parsers for switch values; an unknown value throws std::invalid_argument naming the
// parameter, the value and the accepted values.
OptimizerType parse_optimizer_type(std::string_view v);
InnerRule parse_inner_rule(std::string_view v);
UpdateMode parse_update_mode(std::string_view v);
MaskStatistic parse_mask_statistic(std::string_view v);
MaskPartition parse_mask_partition(std::string_view v);
SecondMoment parse_second_moment(std::string_view v);
MaskEncoding parse_mask_encoding(std::string_view v);
Formulation parse_formulation(std::string_view v);
MaskScope parse_mask_scope(std::string_view v);
AdamsForm parse_adams_form(std::string_view v);  // "automatic" is not a name users give
const char* to_string(OptimizerType v);
const char* to_string(InnerRule v);
const char* to_string(UpdateMode v);
const char* to_string(MaskStatistic v);
const char* to_string(MaskPartition v);
const char* to_string(SecondMoment v);
const char* to_string(MaskEncoding v);
const char* to_string(Formulation v);
const char* to_string(MaskScope v);
const char* to_string(AdamsForm v);
// The accepted names of an enum switch ("type", "inner", "update", "mask_statistic",
// "mask_partition", "second_moment", "mask_encoding", "formulation", "mask_scope", "adams_form"), in the order errors
// list them; the config key table reads them from here so each name is written once. Throws std::invalid_argument for
// another key.
std::vector<std::string> optimizer_switch_names(std::string_view key);

// The range of a numeric optimizer key, written once: OptimizerConfig::validate() enforces it
// and the config key table publishes it in the JSON Schema. NaN is never in range.
struct OptimizerKeyRange {
  const char* key;
  double minimum;
  double maximum;
  bool exclusive_minimum;
  bool exclusive_maximum;
  const char* rule;  // how an error states the range
};
// The range of `key` ("lr", "sparsity", ...); throws std::invalid_argument for a key without one.
const OptimizerKeyRange& optimizer_key_range(std::string_view key);

// SCAPE's own switches (optimizer.type = "scape"; docs/algorithms.md, "SCAPE" and "Switches").
// The JSON keys stay flat: optimizer.mask_lag sets scape.mask_lag.
struct ScapeSwitches {
  UpdateMode update = UpdateMode::masked;
  MaskStatistic mask_statistic = MaskStatistic::first_moment;
  MaskPartition mask_partition = MaskPartition::partitioned;
  int mask_lag = 1;
  SecondMoment second_moment = SecondMoment::single_buffer;
  // The algorithm, where it counts k, and the tensors always on its mask (by name substring;
  // absent from a config: {"norm", "bias"} under mask_scope = tensor, {} under shard).
  Formulation formulation = Formulation::paper;
  MaskScope mask_scope = MaskScope::tensor;
  std::vector<std::string> dense_tensors = {"norm", "bias"};
  // Keep the residual in (pinned) host memory and stream it through two device chunks of
  // offload_chunk elements each (docs/algorithms.md, "Devices and residual offload").
  bool residual_offload = false;
  std::size_t offload_chunk = std::size_t{1} << 22;
};

// 1-bit Adam: dense AdamW steps before the variance is frozen, and the coordinates that share
// one scale of the sign compression.
struct OnebitAdamSwitches {
  int freeze_step = 100;
  std::size_t sign_chunk = 2048;
};

// PowerSGD: the rank r of each matrix's factors (clipped to min(rows, cols)).
struct PowersgdSwitches {
  int rank = 4;
};

// DeMo (decoupled momentum): coordinates per DCT chunk of the flat buffer, and coefficients each
// chunk sends.
struct DecoMomentumSwitches {
  std::size_t chunk = 64;
  std::size_t topk = 4;
};

// The outer loop DiLoCo and SparseLoCo share (docs/algorithms.md, "DiLoCo"): each worker takes
// inner_steps = H steps of its own AdamW or AdamS (`inner`), then the workers exchange their
// pseudo-gradients and take one outer step.
struct OuterLoopSwitches {
  int inner_steps = 10;
  double outer_lr = -1.0;  // negative: the type's default, resolved_outer_lr()
  // DiLoCoX's one-step delay: the outer step's result is applied one inner step later, so that its
  // collective overlaps that step's compute.
  bool overlap_outer = false;
};

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

// Hyper-parameters and switches. Defaults are the documented ones (docs/algorithms.md). The
// fields every method reads, or several do, sit at the top level; one method's own switches in
// its sub-struct.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::scape;
  double lr = 6e-4;
  double min_lr = -1.0;  // negative: lr / 10
  int warmup_steps = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool bias_correction = true;
  double sparsity = 0.99;  // density rho = 1 - sparsity (SCAPE and top-k only)
  bool sharded = true;     // distributed optimizer; topk_ef and randk_ef require false
  // Dense sharded AdamW / AdamS: reduce-scatter the gradient bucket by bucket while the backward
  // pass goes on (Megatron's --overlap-grad-reduce) instead of once after it; fp32 wire only.
  bool overlap_grad_reduce = false;
  WireType wire_dtype = WireType::fp32;   // gradient-like payloads
  WireType param_dtype = WireType::fp32;  // parameter payloads
  InnerRule inner = InnerRule::adams;     // SCAPE, topk_ef, randk_ef and powersgd
  MaskEncoding mask_encoding = MaskEncoding::elias_fano;  // SCAPE and topk_ef
  bool residual = true;
  // Off the mask the residual keeps residual_decay * a_i (1 keeps it all, 0 equals residual =
  // false); residual_clip > 0 caps each tensor's ||e_i|| at that multiple of its ||g_i|| before
  // step 1 (0 = off). SCAPE, topk_ef and randk_ef.
  double residual_decay = 1.0;
  double residual_clip = 0.0;
  int density_warmup = 0;
  // The density schedule's start density s and the geometric cool-down back to 1 over
  // density_cooldown steps from step density_cooldown_start (0 steps = off).
  double density_start = 1.0;
  int density_cooldown = 0;
  int density_cooldown_start = 0;
  AdamsForm adams_form = AdamsForm::automatic;
  // Global-norm clipping of the synchronized (SCAPE: reconstructed) gradient at this norm; 0 = off.
  double clip_grad = 0.0;
  std::uint64_t seed = 0;  // the random mask statistic and randk_ef's shared mask
  // Where the optimizer's kernels and state live (SCAPE, AdamW and AdamS for cuda;
  // docs/algorithms.md, "Devices and residual offload").
  kernels::DeviceKind device = kernels::DeviceKind::cpu;

  ScapeSwitches scape;
  OnebitAdamSwitches onebit;
  PowersgdSwitches powersgd;
  DecoMomentumSwitches demo;
  OuterLoopSwitches outer;
  DilocoSwitches diloco;
  SparselocoSwitches sparseloco;

  double density() const { return 1.0 - sparsity; }
  double resolved_min_lr() const { return min_lr < 0 ? lr / 10.0 : min_lr; }
  // outer_lr, with a negative value resolved: 0.7 for DiLoCo (the DiLoCo paper's), 0.9 for
  // SparseLoCo (Templar's outer_learning_rate; docs/algorithms.md, "SparseLoCo").
  double resolved_outer_lr() const;
  // adams_form, with automatic resolved: momentum_corrected for SCAPE's frozen_momentum, the
  // artifact's form for everything else.
  AdamsForm resolved_adams_form() const;
  DensitySchedule density_schedule() const {
    return {density(), density_start, density_warmup, density_cooldown, density_cooldown_start};
  }
  // SCAPE with a momentum-unit residual (paper, artifact) and sharded state: the owner keeps
  // every worker's undelivered b1 m_prev over its shard (docs/algorithms.md, "SCAPE").
  bool carries_owner_momentum() const {
    return type == OptimizerType::scape && scape.formulation != Formulation::frozen_momentum && sharded &&
           residual && residual_decay > 0;
  }
  // Whether a tensor of this name is always on SCAPE's mask.
  bool dense_tensor(std::string_view name) const;
  // Throws std::invalid_argument naming the first offending parameter and its value.
  void validate() const;
};


// The local-SGD methods: H inner steps on each worker's own parameters, then an outer step.
inline bool has_outer_loop(OptimizerType t) { return t == OptimizerType::diloco || t == OptimizerType::sparseloco; }

// The comparison baselines (topk_ef, randk_ef, onebit_adam, powersgd, demo, diloco, sparseloco)
// keep replicated optimizer state only.
inline bool replicated_only(OptimizerType t) {
  return t == OptimizerType::topk_ef || t == OptimizerType::randk_ef || t == OptimizerType::onebit_adam ||
         t == OptimizerType::powersgd || t == OptimizerType::demo || has_outer_loop(t);
}

// The types with a CUDA path (device = cuda): SCAPE and the dense AdamW and AdamS; the
// baselines run on the CPU.
inline bool runs_on_cuda(OptimizerType t) {
  return t == OptimizerType::scape || t == OptimizerType::adamw || t == OptimizerType::adams;
}

// Whether the optimizer reports the sparse metrics (mask, residual, staleness): SCAPE, topk_ef
// and randk_ef.
bool has_sparse_metrics(const OptimizerConfig& c);

}  // namespace scape
