// Time of one training step on W GPUs (docs/PREDICTING.md, "Step time"): compute from FLOPs,
// every collective from the shared byte ledger (optimizers/volume.hpp) costed on the two-level
// network, the overlap model that decides how much of each is exposed, and the optimizer
// step costed from the bytes it touches at the device memory bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layout.hpp"
#include "core/ledger.hpp"
#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"
#include "predict/topology.hpp"
#include "presets/gpu_presets.hpp"

namespace scape::predict {

// Which collectives hide behind which compute (all switchable).
struct OverlapModel {
  bool grad_reduce = true;     // dense gradient reduction in buckets during the backward pass
  bool param_gather = true;    // parameter all-gather in buckets during the next forward pass
  bool sparse_reduce = false;  // SCAPE under mask lag 1: its reduction bucketed in the backward pass too
  bool mask_gather = true;     // SCAPE's lagged mask all-gather behind the next forward and backward
  double bucket_MB = 25.0;     // bucket size of the bucketed collectives, 1e6 bytes
};

// The window a collective can hide in.
enum class Window { none, forward, backward, compute };
const char* to_string(Window w);

struct CollectiveTime {
  CommRecord record;  // as the ledger counts it (payload, flat-ring bytes per worker)
  Window window = Window::none;
  int buckets = 1;           // calls it is issued as
  double time_s = 0;         // all its calls on the two-level network
  double exposed_s = 0;      // what the step waits for
  double intra_bytes = 0;    // bytes one GPU sends on NVLink, all calls
  double inter_bytes = 0;    // bytes one GPU sends across nodes, all calls
};

struct StepInputs {
  OptimizerConfig optimizer;
  std::uint64_t n_params = 0;
  // The model's tensors (predict/model_layout.hpp), whose per-tensor k, owners and dense_tensors
  // decide SCAPE's K and mask bytes; empty: one tensor of n_params elements. Its size is n_params.
  ParamLayout layout{ParamLayout::kUnbounded};
  double flops_per_token = 0;  // training FLOPs per token
  // When positive, forward and backward take this long whatever the FLOPs (a run whose ranks
  // sleep for a GPU's compute, compute.type "sleep"): a third forward, two thirds backward.
  double fixed_compute_s = 0;
  // Otherwise, when positive: seconds of forward and backward per token (the per-GEMM model,
  // predict/gemm_model.hpp), instead of the FLOPs at one achieved rate.
  double compute_s_per_token = 0;
  double fill_in = 1.0;        // local_union: |M| = fill_in K, clamped to [K, min(N, W K)]
  presets::GpuSpec gpu;
  Topology topology;
  OverlapModel overlap;
};

// Bytes of device memory one GPU touches in the optimizer step, by the kernel that touches
// them (docs/PREDICTING.md, "Optimizer step"); each is costed at its own throughput.
struct OptimizerBytes {
  double select = 0;  // top-k selection: the statistic and the selection passes
  double pack = 0;    // mask packing: gather the masked values, zero the residual there
  double state = 0;   // everything else: accumulate, weight decay, the (masked) Adam step
  double total() const { return select + pack + state; }
};

struct StepPrediction {
  int workers = 1;
  double tokens_per_gpu = 0;
  double forward_s = 0;
  double backward_s = 0;   // twice the forward pass
  double optimizer_s = 0;  // state + select + pack + exposed offload
  double optimizer_bytes = 0;
  double state_s = 0;      // the optimizer's streaming kernels at the memory bandwidth
  double select_s = 0;     // top-k selection
  double pack_s = 0;       // mask packing; mask coding (issue 16) adds its own term beside it
  double offload_s = 0;    // residual offload: host-device copies of every pass
  double offload_exposed_s = 0;  // what the double-buffered pipeline does not hide
  double mask_codec_s = 0;  // coding and decoding SCAPE's mask (encodings other than bitmap)
  std::vector<CollectiveTime> collectives;
  double comm_s = 0;          // every collective, hidden or not
  double exposed_comm_s = 0;
  double step_s = 0;          // forward + backward + optimizer + mask coding + exposed communication
  double compute_s() const { return forward_s + backward_s; }
};

// The step the prediction costs: a steady-state step of a long run, past the density warm-up
// (1-bit Adam: past freeze_step),
// that both receives a lagged mask and starts the next one.
int steady_state_step(const OptimizerConfig& c);

// Bytes of device memory one GPU reads and writes in the optimizer step (the table of
// docs/PREDICTING.md), for a step with mask size `mask_size` (K, or |M| for local_union).
double optimizer_step_bytes(const OptimizerConfig& c, std::uint64_t n, int workers, std::uint64_t mask_size);
OptimizerBytes optimizer_bytes_by_kernel(const OptimizerConfig& c, std::uint64_t n, int workers,
                                         std::uint64_t mask_size);

// Exposed seconds of a residual pass streamed through two device chunks: C chunks go through
// upload, kernel and download, each stage one chunk at a time, so the pass takes
// (u + k + d) / C + (C - 1) max(u, k, d) / C with u = d = `copy_s` (up and down run on their
// own directions) and k = `kernel_s`; what exceeds the kernels' own time is exposed.
double double_buffered_exposed(double copy_s, double kernel_s, double chunks);

// Seconds one worker spends coding its mask shard (N/W coordinates) and decoding all W shards
// (N): (1 + 1/W) / 2 of the encode + decode time of N coordinates at a measured throughput, or
// without one the bytes the CUDA kernels move, N/8 + 8K + 3N/(4W), at the memory bandwidth;
// 0 for the bitmap, local_union and the optimizers without a partitioned mask.
double mask_codec_seconds(const OptimizerConfig& c, std::uint64_t n, int workers, const presets::GpuSpec& gpu);
// The same with K counted over `layout`'s tensors (n = layout.size()).
double mask_codec_seconds(const OptimizerConfig& c, const ParamLayout& layout, int workers,
                          const presets::GpuSpec& gpu);

// Exposed part of `time_s` of communication issued as `buckets` equal buckets that become
// ready one by one over `window_s` of compute: max(time / B, time - window (B - 1) / B).
double bucketed_exposed(double time_s, int buckets, double window_s);

// What one GPU's optimizer steps: the whole layout among all W workers (flat), or under
// optimizer.hierarchy = "node" the part of the rail the step waits for (the largest) among the
// W / G nodes, G = `gpus_per_node`. Calibration reads a hierarchical run's records of that rail.
struct MethodShare {
  OptimizerConfig flat;  // the method's own config (hierarchy flat)
  ParamLayout layout{ParamLayout::kUnbounded};
  std::uint64_t n = 0;
  int workers = 1;
  int rail = 0;
};
MethodShare method_share(const OptimizerConfig& c, const ParamLayout& layout, std::uint64_t n_params, int workers,
                         int gpus_per_node);

// One step on W GPUs with `tokens_per_gpu` tokens each. Throws std::invalid_argument on a
// placement the topology cannot hold.
StepPrediction predict_step(const StepInputs& in, int workers, double tokens_per_gpu);

}  // namespace scape::predict
