// Per-GEMM compute time (docs/PREDICTING.md, "Per-GEMM compute"): a transformer's forward and
// backward pass as its GEMMs, each at the efficiency its shape reaches on the GPU's curve
// (presets::GemmCurve), plus the memory-bound elementwise kernels at the memory bandwidth; and the
// least-squares fit of the curve to timed GEMMs.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "presets/gpu_presets.hpp"
#include "presets/model_presets.hpp"

namespace scape::predict {

// C (m x n) = A (m x k) B (k x n), done `count` times in a training step of one micro-batch.
struct Gemm {
  std::string name;
  double m = 0, n = 0, k = 0;
  double count = 1;
  double flops() const { return 2.0 * m * n * k * count; }
  // FLOPs per byte of bf16 A, B and C: m n k / (m k + k n + m n). The same for the forward GEMM
  // and the two backward ones (their shapes are permutations of it).
  double intensity() const { return m * n * k / (m * k + k * n + m * n); }
};

// What one micro-batch's forward and backward pass computes.
struct ComputeWork {
  std::vector<Gemm> gemms;       // forward and backward, attention's score and value products included
  double elementwise_bytes = 0;  // norms, activations, rotary, residual adds, the loss
  double tokens = 0;             // of the micro-batch
};

// The GEMMs of `m` at `seq_len` tokens a sequence and `micro_batch` sequences: per layer the
// fused QKV projection, the attention output, the MLP (llama: gate and up fused, then down;
// gpt2: up, down) and the causal score and value products per head (flash attention: the score
// matrix is never written, so their shape is that of one head's sequence against itself, half of
// it computed); the output head once. Each counts three times (forward, and the input and
// weight gradients of backward), as training_flops_per_token counts them; their FLOPs add up to
// it exactly.
ComputeWork compute_work(const presets::ModelSpec& m, int seq_len, int micro_batch);

// Seconds of the micro-batch's work on `curve`, split in the GEMMs' time at max_efficiency 1
// (the fit scales it by 1 / max_efficiency) and the elementwise kernels' time.
struct ComputeSeconds {
  double gemm_at_full_efficiency = 0;
  double elementwise = 0;
  double total(const presets::GemmCurve& curve) const {
    return gemm_at_full_efficiency / curve.max_efficiency + elementwise;
  }
};
// Throws std::invalid_argument when the curve has no positive peak, ridge or memory bandwidth.
ComputeSeconds compute_seconds(const ComputeWork& work, const presets::GemmCurve& curve);

// Efficiency of one GEMM on `curve` (fraction of the peak).
double gemm_efficiency(const presets::GemmCurve& curve, const Gemm& g);

// A timed GEMM: its shape (count included in flops) and the measured seconds.
struct GemmSample {
  Gemm gemm;
  double time_s = 0;
};

// Fits max_efficiency and ridge_flop_per_byte of a curve with the given peak and memory
// bandwidth to timed GEMMs: t = F / (P e) (1 + r / x) is linear in 1 / e and r / e, so least
// squares in relative error (every sample weighted by 1 / t^2) is solved exactly, and the fit is
// deterministic. Throws std::invalid_argument for fewer than two distinct intensities or a fit
// whose efficiency or ridge is not positive.
presets::GemmCurve fit_gemm_curve(std::span<const GemmSample> samples, double peak_TFLOPs, double memory_TBps);

}  // namespace scape::predict
