// CPU bodies of the model ops (contracts: kernels/model_kernel_list.inc), templated on the
// element type: the CPU backend instantiates them for float (kernels/cpu/model_ops.cpp) and
// CpuModelOps<double> runs them directly for the finite-difference gradient check, so both
// precisions execute the same code. Loops are OpenMP over rows with Eigen inside; every sum
// has an order fixed by index alone (results independent of thread count and alignment).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/model_attention.hpp"
#include "kernels/cpu/model_eigen.hpp"
#include "kernels/model_checks.hpp"

namespace scape::kernels::model_cpu {

inline void check_token(std::int32_t token, Index rows, const char* op) {
  if (token < 0 || token >= rows) {
    throw std::out_of_range(std::string(op) + ": token " + std::to_string(token) + " outside [0, " +
                            std::to_string(rows) + ")");
  }
}

// ---- bias, residual and embedding -------------------------------------------------------------

template <class R>
void bias_forward(std::span<R> out, std::span<const R> resid, std::span<const R> bias, int N, int M) {
  checks::require_elements(out.size(), checks::elements(N, M), "bias_forward: out");
  if (!resid.empty()) checks::require_elements(resid.size(), out.size(), "bias_forward: resid");
  checks::require_elements(bias.size(), checks::elements(1, M), "bias_forward: bias");
  const ConstVecView<R> b(bias.data(), M);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * M))
  for (Index i = 0; i < N; ++i) {
    if (!resid.empty()) {
      VecView<R>(out.data() + i * M, M) = ConstVecView<R>(resid.data() + i * M, M) + b;
    } else {
      VecView<R>(out.data() + i * M, M) = b;
    }
  }
}

// out[j] += sum_i x[i, j] over a row-major [N, M] matrix, in row chunks added in chunk order.
template <class R>
void column_sums_add(R* out, const R* x, Index N, Index M) {
  const Index chunks = std::min(kSumChunks, N);
  std::vector<R> partial(static_cast<std::size_t>(chunks * M));
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * M))
  for (Index c = 0; c < chunks; ++c) {
    VecView<R> acc(partial.data() + c * M, M);
    acc.setZero();
    for (Index i = N * c / chunks; i < N * (c + 1) / chunks; ++i) acc += ConstVecView<R>(x + i * M, M);
  }
  VecView<R> total(out, M);
  for (Index c = 0; c < chunks; ++c) total += ConstVecView<R>(partial.data() + c * M, M);
}

template <class R>
void bias_backward(std::span<R> dbias, std::span<const R> dy, int N, int M) {
  checks::require_elements(dy.size(), checks::elements(N, M), "bias_backward: dy");
  checks::require_elements(dbias.size(), checks::elements(1, M), "bias_backward: dbias");
  column_sums_add(dbias.data(), dy.data(), N, M);
}

template <class R>
void residual_add(std::span<const R> a, std::span<const R> b, std::span<R> out) {
  checks::require_elements(b.size(), a.size(), "residual_add: b");
  checks::require_elements(out.size(), a.size(), "residual_add: out");
  const auto n = static_cast<Index>(a.size());
#pragma omp parallel for schedule(static) if (parallel_worth(double(n)))
  for (Index i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class R>
void embedding_forward(std::span<R> out, std::span<const R> wte, std::span<const R> wpe,
                       std::span<const std::int32_t> tokens, int B, int T, int C) {
  const auto N = static_cast<Index>(checks::embedding("embedding_forward", B, T, C, out.size(), "out", tokens.size(),
                                                      !wpe.empty(), wpe.size(), "wpe"));
  const Index rows = static_cast<Index>(wte.size()) / std::max(C, 1);
  for (const std::int32_t token : tokens) check_token(token, rows, "embedding_forward");
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (Index i = 0; i < N; ++i) {
    const ConstVecView<R> row(wte.data() + tokens[i] * C, C);
    if (wpe.empty()) {
      VecView<R>(out.data() + i * C, C) = row;
    } else {
      VecView<R>(out.data() + i * C, C) = row + ConstVecView<R>(wpe.data() + (i % T) * C, C);
    }
  }
}

template <class R>
void embedding_backward(std::span<R> dwte, std::span<R> dwpe, std::span<const R> dout,
                        std::span<const std::int32_t> tokens, int B, int T, int C) {
  const auto N = static_cast<Index>(checks::embedding("embedding_backward", B, T, C, dout.size(), "dout", tokens.size(),
                                                      !dwpe.empty(), dwpe.size(), "dwpe"));
  const Index rows = static_cast<Index>(dwte.size()) / std::max(C, 1);
  for (const std::int32_t token : tokens) check_token(token, rows, "embedding_backward");
  if (!dwpe.empty()) {
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
    for (Index t = 0; t < T; ++t) {
      for (Index b = 0; b < B; ++b) {
        VecView<R>(dwpe.data() + t * C, C) += ConstVecView<R>(dout.data() + (b * T + t) * C, C);
      }
    }
  }
  // Serial: repeated tokens scatter into the same row, and the cost is only B T C adds.
  for (Index i = 0; i < N; ++i) {
    VecView<R>(dwte.data() + tokens[i] * C, C) += ConstVecView<R>(dout.data() + i * C, C);
  }
}

// ---- LayerNorm and RMSNorm ------------------------------------------------------------------

template <class R>
void layernorm_forward(std::span<R> out, std::span<R> mean, std::span<R> rstd, std::span<const R> x,
                       std::span<const R> w, std::span<const R> b, int N, int C, double eps) {
  checks::rows("layernorm_forward", N, C, out.size(), x.size(), mean.size());
  checks::rows("layernorm_forward", N, C, out.size(), x.size(), rstd.size());
  checks::require_elements(w.size() + b.size(), checks::elements(2, C), "layernorm_forward: w, b");
  const ConstVecView<R> gain(w.data(), C), bias(b.data(), C);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (Index i = 0; i < N; ++i) {
    const ConstVecView<R> xi(x.data() + i * C, C);
    const R m = ordered_mean(xi);
    const R var = ordered_mean((xi - m).square());
    const R s = R(1) / std::sqrt(var + R(eps));
    VecView<R>(out.data() + i * C, C) = (xi - m) * s * gain + bias;
    mean[i] = m;
    rstd[i] = s;
  }
}

template <class R>
void layernorm_backward(std::span<R> dx, std::span<R> dw, std::span<R> db, std::span<const R> dout,
                        std::span<const R> x, std::span<const R> w, std::span<const R> mean, std::span<const R> rstd,
                        int N, int C) {
  checks::rows("layernorm_backward", N, C, dx.size(), x.size(), mean.size());
  checks::rows("layernorm_backward", N, C, dout.size(), x.size(), rstd.size());
  checks::require_elements(w.size() + dw.size() + db.size(), checks::elements(3, C), "layernorm_backward: w, dw, db");
  const Index chunks = std::min(kSumChunks, Index(N));
  std::vector<R> partial(static_cast<std::size_t>(chunks * 2 * C));
  const ConstVecView<R> gain(w.data(), C);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (Index c = 0; c < chunks; ++c) {
    VecView<R> pw(partial.data() + c * 2 * C, C), pb(partial.data() + c * 2 * C + C, C);
    pw.setZero();
    pb.setZero();
    for (Index i = N * c / chunks; i < N * (c + 1) / chunks; ++i) {
      const ConstVecView<R> xi(x.data() + i * C, C), dyi(dout.data() + i * C, C);
      const auto norm = (xi - mean[i]) * rstd[i];
      const auto dnorm = dyi * gain;
      const R dnorm_mean = ordered_mean(dnorm);
      const R dnorm_norm_mean = ordered_mean(dnorm * norm);
      VecView<R>(dx.data() + i * C, C) += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
      pw += dyi * norm;
      pb += dyi;
    }
  }
  VecView<R> gw(dw.data(), C), gb(db.data(), C);
  for (Index c = 0; c < chunks; ++c) {
    gw += ConstVecView<R>(partial.data() + c * 2 * C, C);
    gb += ConstVecView<R>(partial.data() + c * 2 * C + C, C);
  }
}

template <class R>
void rmsnorm_forward(std::span<R> out, std::span<R> rrms, std::span<const R> x, std::span<const R> w, int N, int C,
                     double eps) {
  checks::rows("rmsnorm_forward", N, C, out.size(), x.size(), rrms.size());
  checks::require_elements(w.size(), checks::elements(1, C), "rmsnorm_forward: w");
  const ConstVecView<R> gain(w.data(), C);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (Index i = 0; i < N; ++i) {
    const ConstVecView<R> xi(x.data() + i * C, C);
    const R r = R(1) / std::sqrt(ordered_mean(xi.square()) + R(eps));
    VecView<R>(out.data() + i * C, C) = xi * r * gain;
    rrms[i] = r;
  }
}

// With g = dout * w: dx = r (g - x r^2 mean(g x)), dw += dout x r.
template <class R>
void rmsnorm_backward(std::span<R> dx, std::span<R> dw, std::span<const R> dout, std::span<const R> x,
                      std::span<const R> w, std::span<const R> rrms, int N, int C) {
  checks::rows("rmsnorm_backward", N, C, dx.size(), x.size(), rrms.size());
  checks::rows("rmsnorm_backward", N, C, dout.size(), x.size(), rrms.size());
  checks::require_elements(w.size() + dw.size(), checks::elements(2, C), "rmsnorm_backward: w, dw");
  const Index chunks = std::min(kSumChunks, Index(N));
  std::vector<R> partial(static_cast<std::size_t>(chunks * C));
  const ConstVecView<R> gain(w.data(), C);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * C))
  for (Index c = 0; c < chunks; ++c) {
    VecView<R> pw(partial.data() + c * C, C);
    pw.setZero();
    for (Index i = N * c / chunks; i < N * (c + 1) / chunks; ++i) {
      const ConstVecView<R> xi(x.data() + i * C, C), dyi(dout.data() + i * C, C);
      const R r = rrms[i];
      const auto g = dyi * gain;
      const R gx_mean = ordered_mean(g * xi);
      VecView<R>(dx.data() + i * C, C) += (g - xi * (r * r * gx_mean)) * r;
      pw += dyi * xi * r;
    }
  }
  VecView<R> gw(dw.data(), C);
  for (Index c = 0; c < chunks; ++c) gw += ConstVecView<R>(partial.data() + c * C, C);
}

// ---- activations ------------------------------------------------------------------------------

template <class R>
struct GeluConst {
  static constexpr R kS = R(0.7978845608028654);  // sqrt(2/pi)
  static constexpr R kC = R(0.044715);
};

// Elementwise kernels run in fixed chunks so each thread hands Eigen a long vectorisable span.
constexpr Index kElemChunk = 4096;

template <class R>
void gelu_forward(std::span<R> out, std::span<const R> in) {
  checks::require_elements(out.size(), in.size(), "gelu_forward: out");
  using K = GeluConst<R>;
  const auto n = static_cast<Index>(in.size());
#pragma omp parallel for schedule(static) if (parallel_worth(double(n)))
  for (Index o = 0; o < n; o += kElemChunk) {
    const Index len = std::min(kElemChunk, n - o);
    const ConstVecView<R> x(in.data() + o, len);
    VecView<R>(out.data() + o, len) = R(0.5) * x * (R(1) + (K::kS * (x + K::kC * x.cube())).tanh());
  }
}

// tanh is needed twice, so it goes through a small stack buffer rather than a heap temporary.
template <class R>
void gelu_backward(std::span<R> d, std::span<const R> in) {
  checks::require_elements(d.size(), in.size(), "gelu_backward: d");
  using K = GeluConst<R>;
  constexpr Index kBlock = 256;
  const auto n = static_cast<Index>(in.size());
#pragma omp parallel for schedule(static) if (parallel_worth(double(n)))
  for (Index o = 0; o < n; o += kBlock) {
    const Index len = std::min(kBlock, n - o);
    const ConstVecView<R> x(in.data() + o, len);
    VecView<R> dv(d.data() + o, len);
    const Eigen::Array<R, Eigen::Dynamic, 1, 0, kBlock, 1> th = (K::kS * (x + K::kC * x.cube())).tanh();
    dv *= R(0.5) * (R(1) + th) + R(0.5) * x * (R(1) - th.square()) * K::kS * (R(1) + R(3) * K::kC * x.square());
  }
}

template <class R>
void swiglu_forward(std::span<R> out, std::span<const R> gate_up, int N, int H) {
  checks::require_elements(out.size(), checks::elements(N, H), "swiglu_forward: out");
  checks::require_elements(gate_up.size(), checks::elements(N, 2 * Index(H)), "swiglu_forward: gate_up");
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * H))
  for (Index i = 0; i < N; ++i) {
    const R* g = gate_up.data() + i * 2 * H;
    R* o = out.data() + i * H;
    for (Index j = 0; j < H; ++j) o[j] = g[j] / (R(1) + std::exp(-g[j])) * g[H + j];
  }
}

// silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
template <class R>
void swiglu_backward(std::span<R> dgate_up, std::span<const R> dout, std::span<const R> gate_up, int N, int H) {
  checks::require_elements(dout.size(), checks::elements(N, H), "swiglu_backward: dout");
  checks::require_elements(gate_up.size(), checks::elements(N, 2 * Index(H)), "swiglu_backward: gate_up");
  checks::require_elements(dgate_up.size(), gate_up.size(), "swiglu_backward: dgate_up");
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * H))
  for (Index i = 0; i < N; ++i) {
    const R* g = gate_up.data() + i * 2 * H;
    const R* dy = dout.data() + i * H;
    R* dg = dgate_up.data() + i * 2 * H;
    for (Index j = 0; j < H; ++j) {
      const R s = R(1) / (R(1) + std::exp(-g[j]));
      dg[j] = dy[j] * g[H + j] * (s * (R(1) + g[j] * (R(1) - s)));
      dg[H + j] = dy[j] * (g[j] * s);
    }
  }
}

// ---- loss -----------------------------------------------------------------------------------

template <class R>
double cross_entropy(std::span<R> logits, std::span<R> row_loss, std::span<const std::int32_t> targets, int N, int V,
                     bool with_gradient) {
  checks::require_elements(logits.size(), checks::elements(N, V), "cross_entropy: logits");
  checks::require_elements(row_loss.size(), checks::elements(N, 1), "cross_entropy: row_loss");
  checks::require_elements(targets.size(), checks::elements(N, 1), "cross_entropy: targets");
  for (const std::int32_t token : targets) check_token(token, V, "cross_entropy");
  const R inv_n = R(1) / R(N);
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * V))
  for (Index i = 0; i < N; ++i) {
    VecView<R> z(logits.data() + i * V, V);
    const R m = z.maxCoeff();
    const R zt = z[targets[i]];
    if (with_gradient) {
      z = (z - m).exp();
      const R sum = ordered_sum(z);
      row_loss[i] = std::log(sum) + m - zt;
      z *= inv_n / sum;
      flush_subnormal(z);
      z[targets[i]] -= inv_n;
    } else {
      row_loss[i] = std::log(ordered_sum((z - m).exp())) + m - zt;
    }
  }
  double total = 0;  // serial, in double: deterministic and free of float drift
  for (Index i = 0; i < N; ++i) total += static_cast<double>(row_loss[i]);
  return total / static_cast<double>(N);
}

}  // namespace scape::kernels::model_cpu

namespace scape::kernels {

// The model ops of kernels/model_kernel_list.inc with element type R, run by the CPU bodies
// above: the same member names and signatures as KernelBackend's model ops, so the model is
// written once against either (model/gpt.cpp uses this for double).
template <class R>
class CpuModelOps {
 public:
  using ModelReal = R;
#define SCAPE_KERNEL(result, name, parameters, arguments) \
  result name parameters { return model_cpu::name<R> arguments; }
#include "kernels/model_kernel_list.inc"
#undef SCAPE_KERNEL
};

}  // namespace scape::kernels
