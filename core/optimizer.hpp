// The optimizer interface and what one step reports. An optimizer is an update rule (AdamW or
// AdamS) times a gradient-sync policy (dense, SCAPE, raw-gradient top-k, shared-seed random-k,
// PowerSGD's low-rank factors), 1-bit Adam, or DeMo's DCT top-k with sign steps; see
// docs/algorithms.md. Optimizers see only flat spans and a Communicator; what they share is
// core/optimizer_base.hpp, and optimizers/make_optimizer.hpp builds one from its config.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/layout.hpp"
#include "core/ledger.hpp"
#include "core/optimizer_config.hpp"
#include "core/state.hpp"

namespace scape {

// What one step on one worker knows. NaN marks a metric that does not apply.
struct StepMetrics {
  int step = 0;
  double lr = 0;
  double target_density = 0;     // rho_t
  std::size_t k_total = 0;       // K
  std::size_t mask_size = 0;     // |M_t|
  double mask_density = 0;       // |M_t| / N
  double mask_jaccard = 0;       // with the previous step's mask
  double fill_in = 0;            // |M_t| / K
  double residual_norm = 0;      // ||e_i||_2 after the step
  double residual_max = 0;
  double residual_to_param = 0;  // ||e_i||_2 / ||theta||_2
  double residual_clipped_norm = 0;  // ||part of e_i removed by residual_clip||_2 this step
  double staleness_mean = 0;     // steps since each coordinate was last delivered
  double staleness_p99 = 0;
  double staleness_max = 0;
  double update_norm = 0;        // ||delta theta||_2
  double update_max = 0;
  double update_sign_flip = 0;   // fraction of coordinates stepped in both steps whose sign flipped
  std::size_t nonfinite_grads = 0;
  double mask_codec_s = 0;       // wall seconds coding and decoding the mask this step
  // DiLoCo and SparseLoCo at a step that syncs (NaN at the others and for every other method):
  // ||Delta_i||_2 of this worker's pseudo-gradient, and ||theta_i - theta_bar||_2, its distance
  // from the workers' mean before the sync (NaN for SparseLoCo, which never forms that mean).
  double pseudo_grad_norm = std::numeric_limits<double>::quiet_NaN();
  double param_drift = std::numeric_limits<double>::quiet_NaN();
  std::vector<CommRecord> comm;  // every collective of this step
  // Per tensor, in layout order.
  std::vector<double> tensor_residual_norm;
  std::vector<double> tensor_mask_density;
  std::vector<double> tensor_mask_jaccard;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One step of this worker. Collective: every rank calls it with its own replica of the
  // parameters and its own local gradient, both of layout size N.
  virtual StepMetrics step(std::span<float> params, std::span<const float> grads) = 0;
  // Whether the optimizer takes the gradient bucket by bucket during the backward pass
  // (overlap_grad_reduce): gradient_ready is then called, in backward order, for ranges that
  // tile [0, N) once their gradient is final, before step() with the same grads. A step without
  // any gradient_ready call reduces the whole gradient in step().
  virtual bool reduces_in_backward() const { return false; }
  virtual void gradient_ready(std::span<const float> /*grads*/, std::size_t /*begin*/, std::size_t /*end*/) {}
  // Waits for outstanding asynchronous collectives (call before destroying the communicator).
  virtual void finish() {}
  // The global mask used by the last step (empty for dense optimizers; this worker's local
  // mask for topk_ef, the shared mask for randk_ef). Words cover N bits.
  virtual std::span<const std::uint64_t> mask() const { return {}; }
  // This worker's error-feedback residual (empty for dense optimizers).
  virtual std::span<const float> residual() const { return {}; }
  // This worker's first moment m over its own shard S_w, between steps (the m_prev of the next
  // step's mask statistic, for the oracle metrics); empty where no mask statistic reads m.
  virtual std::span<const float> own_first_moment() const { return {}; }
  // Where the kernels run, and the device memory the residual saves when offloaded; one line.
  virtual std::string device_summary() const { return "cpu"; }
  int steps_done() const { return t_; }
  // Everything that influences later steps, for checkpoints. save_state completes outstanding
  // asynchronous collectives first (collective: every rank calls it at the same step).
  virtual void save_state(StateMap& state) = 0;
  virtual void load_state(const StateMap& state) = 0;

 protected:
  int t_ = 0;
};

}  // namespace scape
