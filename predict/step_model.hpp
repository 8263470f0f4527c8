// Time of one training step on W GPUs (docs/PREDICTING.md, "Step time"): compute from FLOPs,
// every collective from the shared byte ledger (core/volume.hpp) costed on the two-level
// network, the overlap model that decides how much of each is exposed, and the optimizer
// step costed from the bytes it touches at the device memory bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ledger.hpp"
#include "core/optimizer.hpp"
#include "predict/hardware.hpp"
#include "predict/topology.hpp"

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
  double flops_per_token = 0;  // training FLOPs per token
  double fill_in = 1.0;        // local_union: |M| = fill_in K, clamped to [K, min(N, W K)]
  GpuSpec gpu;
  Topology topology;
  OverlapModel overlap;
};

struct StepPrediction {
  int workers = 1;
  double tokens_per_gpu = 0;
  double forward_s = 0;
  double backward_s = 0;   // twice the forward pass
  double optimizer_s = 0;  // the optimizer step, memory bound
  double optimizer_bytes = 0;
  std::vector<CollectiveTime> collectives;
  double comm_s = 0;          // every collective, hidden or not
  double exposed_comm_s = 0;
  double step_s = 0;          // forward + backward + optimizer + exposed communication
  double compute_s() const { return forward_s + backward_s; }
};

// The step the prediction costs: a steady-state step of a long run, past the density warm-up
// (1-bit Adam: past freeze_step),
// that both receives a lagged mask and starts the next one.
int steady_state_step(const OptimizerConfig& c);

// Bytes of device memory one GPU reads and writes in the optimizer step (the table of
// docs/PREDICTING.md), for a step with mask size `mask_size` (K, or |M| for local_union).
double optimizer_step_bytes(const OptimizerConfig& c, std::uint64_t n, int workers, std::uint64_t mask_size);

// Exposed part of `time_s` of communication issued as `buckets` equal buckets that become
// ready one by one over `window_s` of compute: max(time / B, time - window (B - 1) / B).
double bucketed_exposed(double time_s, int buckets, double window_s);

// One step on W GPUs with `tokens_per_gpu` tokens each. Throws std::invalid_argument on a
// placement the topology cannot hold.
StepPrediction predict_step(const StepInputs& in, int workers, double tokens_per_gpu);

}  // namespace scape::predict
