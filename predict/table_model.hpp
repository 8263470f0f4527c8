// The artifact's timing setups and table methods modelled with the step model, and the fit of a
// cluster's free parameters to a measured step-time table (`scape predict --calibrate-table`,
// `--validate`; docs/PREDICTING.md, "Measured tables").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/optimizer.hpp"
#include "predict/calibration.hpp"
#include "predict/gemm_model.hpp"
#include "predict/measured_table.hpp"
#include "predict/step_model.hpp"
#include "presets/model_presets.hpp"

namespace scape::predict {

// One of the artifact's timing runs: the model shape, the sequence length, the micro-batch of
// one forward/backward and the global batch of one optimizer step (gradient accumulation makes
// up the difference), pure data parallel on one GH200 per node.
struct TimingSetup {
  std::string model;  // a kTableModels name
  presets::ModelSpec spec;
  int seq_len = 0;
  int micro_batch = 0;
  int global_batch = 0;
  const char* source = "";
};
// Throws std::invalid_argument naming the model for an unknown one.
const TimingSetup& timing_setup(std::string_view model);

// A table row's optimizer as the artifact runs it: dense AdamS in the artifact's form or SCAPE
// in the artifact formulation at density d, replicated or with the distributed optimizer
// (sharded state), the CPU offload of the residual; fp32 gradient values on the wire, bf16
// parameters gathered; the offloads the artifact's launch scripts set for the row
// (docs/PREDICTING.md). Memory methods (scape, scape_offload, ...) take d = 0.01. Throws
// std::invalid_argument for an unknown method.
OptimizerConfig table_optimizer(std::string_view method);
// Whether the row also offloads the distributed optimizer's fp32 parameter replica
// (--topk-adams-full-param-cpu-offload).
bool replica_offload(std::string_view method);

// The step model for one row under calibration `c`: one GPU per node on the calibrated link,
// blocking collectives after the backward pass, the lagged mask all-gather behind compute, the
// optimizer's kernels at the fitted throughput, the offload over the GH200's CPU-GPU link.
StepInputs table_inputs(const Calibration& c, const TimingSetup& setup, const OptimizerConfig& optimizer);
StepPrediction predict_table_row(const Calibration& c, const MeasuredRow& row);

// Seconds of forward and backward per token of the setup's micro-batch on the calibration's
// GEMM curve, split as compute_seconds splits them. Throws std::invalid_argument when the
// calibration has no fitted curve.
ComputeSeconds table_compute_per_token(const Calibration& c, const TimingSetup& setup);

// The GH200's curve before the fit: the preset's (the datasheet peak and memory bandwidth, the
// ridge at their ratio, where a GEMM's bf16 traffic takes as long as its FLOPs), max_efficiency 1. One model's
// table cannot fit the ridge: its micro-batch, and so every GEMM's shape, is the same in every
// row, and all its compute is one number per token (docs/PREDICTING.md, "Per-GEMM compute").
presets::GemmCurve gh200_curve_shape();

// What the fit takes compute to be: the training FLOPs at one achieved FLOP/s (the model before
// issue 58), or the per-GEMM model on a curve of the given shape whose max_efficiency is fitted.
enum class TableCompute { flops, gemm };

// Fits the compute (achieved FLOP/s, or the curve's max_efficiency with the ridge, peak and
// memory bandwidth of `shape`), the optimizer-kernel throughput and the link's alpha and beta to
// the step-time rows of `table` whose gpus are not in `leave_out`, least squares in relative
// error with every parameter kept >= 0. Throws std::invalid_argument for a memory table or
// fewer than four rows.
Calibration fit_step_table(const MeasuredTable& table, const std::vector<int>& leave_out = {},
                           TableCompute compute = TableCompute::flops,
                           const presets::GemmCurve& shape = gh200_curve_shape());

// Peak GPU memory of a memory-table row (docs/PREDICTING.md, "Peak memory"): the buffers one
// GPU holds, in bytes, for the model's timing setup at its micro-batch on `gpus` GPUs.
struct MemoryPrediction {
  double weights = 0;      // bf16 parameters
  double grads = 0;        // fp32 gradient buffer (--accumulate-allreduce-grads-in-fp32)
  double state = 0;        // fp32 master parameters and the first moment (sharded under DO)
  double residual = 0;     // SCAPE's fp32 residual, unless offloaded
  double replica = 0;      // SCAPE with DO: its own whole fp32 master copy and moment
  double activations = 0;  // kept for the backward pass: 34 s b h per layer
  double logits = 0;       // bf16 logits and their fp32 softmax: 6 s b V
  double total_MB() const { return (weights + grads + state + residual + replica + activations + logits) / 1e6; }
};
// The GPU count assumed for the memory figure, whose scripts do not give it.
inline constexpr int kMemoryGpus = 8;
MemoryPrediction predict_memory(const MeasuredRow& row, int gpus = kMemoryGpus);

// The "gemm_curve" section of a table calibration's hardware description.
nlohmann::json gemm_curve_json(const presets::GemmCurve& g);

// The hardware description of a fitted calibration (hardware_json, with gemm_curve_json under
// "gemm_curve" when the calibration has a curve) and its inverse. Throws std::invalid_argument
// naming the file and the field for a missing or bad field.
Calibration calibration_from_hardware(const nlohmann::json& hardware, const std::string& file);

}  // namespace scape::predict
