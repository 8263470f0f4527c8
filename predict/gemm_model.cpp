// Per-GEMM compute time and the fit of the efficiency curve (predict/gemm_model.hpp).
#include "predict/gemm_model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace scape::predict {
namespace {

// Forward, and backward's input and weight gradients.
constexpr double kTrainingPasses = 3.0;
constexpr double kBf16Bytes = 2.0;
constexpr double kFp32Bytes = 4.0;

// Elements the elementwise kernels of one layer read and write per token, forward and backward
// together (each kernel streams its inputs and outputs once; backward reads the forward input and
// the output gradient and writes the input gradient):
//   two norms, 2d forward and 3d backward each;            10 d
//   two residual adds, 3d forward and 3d backward each;    12 d
//   rotary on the queries and keys (llama), 2 (d + d_kv) each way;
//   the MLP activation: SwiGLU 3f forward and 5f backward, GELU 2f and 3f.
double layer_elementwise_elements(const presets::ModelSpec& m) {
  const double d = m.n_embd;
  const double f = static_cast<double>(m.ffn_hidden);
  const double d_kv = d * m.n_kv_head / m.n_head;
  if (m.family == presets::Family::llama) return 22 * d + 4 * (d + d_kv) + 8 * f;
  return 22 * d + 5 * f;
}

void add(std::vector<Gemm>& out, std::string name, double m, double n, double k, double count) {
  out.push_back(Gemm{std::move(name), m, n, k, count});
}

}  // namespace

ComputeWork compute_work(const presets::ModelSpec& m, int seq_len, int micro_batch) {
  if (seq_len < 1 || micro_batch < 1) throw std::invalid_argument("compute_work: seq_len and micro_batch must be >= 1");
  ComputeWork w;
  const double s = seq_len;
  const double rows = s * micro_batch;  // tokens: the M of every weight GEMM
  const double d = m.n_embd;
  const double f = static_cast<double>(m.ffn_hidden);
  const double head = d / m.n_head;
  const double kv_heads = m.family == presets::Family::llama ? m.n_kv_head : m.n_head;
  const double layers = m.n_layer;
  const double passes = kTrainingPasses * layers;
  w.tokens = rows;
  add(w.gemms, "qkv", rows, d + 2 * kv_heads * head, d, passes);
  add(w.gemms, "attention_out", rows, d, d, passes);
  if (m.family == presets::Family::llama) {
    add(w.gemms, "mlp_gate_up", rows, 2 * f, d, passes);
  } else {
    add(w.gemms, "mlp_up", rows, f, d, passes);
  }
  add(w.gemms, "mlp_down", rows, d, f, passes);
  // One head's causal products: half of the s x s scores, and half of the value product.
  const double head_products = 0.5 * m.n_head * micro_batch * passes;
  add(w.gemms, "attention_scores", s, s, head, head_products);
  add(w.gemms, "attention_values", s, head, s, head_products);
  add(w.gemms, "lm_head", rows, static_cast<double>(m.vocab_size), d, kTrainingPasses);
  // The loss reads the bf16 logits and writes their fp32 softmax forward, and backward reads it
  // and writes the bf16 logit gradient: 2 + 4 + 4 + 2 bytes a logit.
  const double loss_bytes = (2 * kBf16Bytes + 2 * kFp32Bytes) * static_cast<double>(m.vocab_size);
  w.elementwise_bytes = rows * (kBf16Bytes * layers * layer_elementwise_elements(m) + loss_bytes);
  return w;
}

double gemm_efficiency(const presets::GemmCurve& curve, const Gemm& g) {
  const double x = g.intensity();
  return curve.max_efficiency * x / (x + curve.ridge_flop_per_byte);
}

ComputeSeconds compute_seconds(const ComputeWork& work, const presets::GemmCurve& curve) {
  if (!(curve.peak_TFLOPs > 0) || !(curve.ridge_flop_per_byte > 0) || !(curve.memory_TBps > 0)) {
    throw std::invalid_argument("compute_seconds: the GEMM curve needs a positive peak, ridge and memory bandwidth");
  }
  ComputeSeconds out;
  const double peak = curve.peak_TFLOPs * 1e12;
  for (const Gemm& g : work.gemms) {
    // At max_efficiency 1: F / (P x / (x + r)) = F (1 + r / x) / P.
    out.gemm_at_full_efficiency += g.flops() * (1 + curve.ridge_flop_per_byte / g.intensity()) / peak;
  }
  out.elementwise = work.elementwise_bytes / (curve.memory_TBps * 1e12);
  return out;
}

presets::GemmCurve fit_gemm_curve(std::span<const GemmSample> samples, double peak_TFLOPs, double memory_TBps) {
  // t / t = 1 = (F / P t) u + (F / (P x t)) v with u = 1 / e and v = r / e: the 2 x 2 normal
  // equations of min sum (a_i u + b_i v - 1)^2.
  double aa = 0, ab = 0, bb = 0, a1 = 0, b1 = 0;
  double lo = INFINITY, hi = 0;
  const double peak = peak_TFLOPs * 1e12;
  for (const GemmSample& s : samples) {
    if (!(s.time_s > 0)) continue;
    const double a = s.gemm.flops() / (peak * s.time_s);
    const double b = a / s.gemm.intensity();
    aa += a * a, ab += a * b, bb += b * b, a1 += a, b1 += b;
    lo = std::min(lo, s.gemm.intensity()), hi = std::max(hi, s.gemm.intensity());
  }
  if (!(hi > lo * (1 + 1e-9))) throw std::invalid_argument("fit_gemm_curve: needs GEMMs of two distinct intensities");
  const double det = aa * bb - ab * ab;
  const double u = (a1 * bb - b1 * ab) / det;
  const double v = (aa * b1 - ab * a1) / det;
  if (!(u > 0) || !(v > 0))
    throw std::invalid_argument("fit_gemm_curve: the fitted efficiency or ridge is not positive");
  return presets::GemmCurve{peak_TFLOPs, v / u, 1 / u, memory_TBps};
}

}  // namespace scape::predict
