// CUDA bodies of the model's elementwise, embedding, norm and loss ops
// (kernels/model_kernel_list.inc). Bias, residual and embedding ops keep the CPU's operation
// order (bias and embedding gradients sum rows in the CPU's chunk order), so they are
// bit-identical to it; norms and the loss reduce rows with warp shuffles, which differ from
// the CPU's 8-lane order by rounding only.
#include <limits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/model_rows.cuh"
#include "kernels/model_checks.hpp"

namespace scape::kernels::cuda {
namespace {

__global__ void bias_forward_kernel(float* out, const float* resid, const float* bias, std::size_t n, int M) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const float b = bias[j % static_cast<std::size_t>(M)];
    out[j] = resid != nullptr ? resid[j] + b : b;
  }
}

__global__ void residual_add_kernel(const float* a, const float* b, float* out, std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) out[j] = a[j] + b[j];
}

__global__ void embedding_forward_kernel(float* out, const float* wte, const float* wpe, const std::int32_t* tokens,
                                         int T, int C, std::size_t n, int rows) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const std::size_t i = j / static_cast<std::size_t>(C), c = j % static_cast<std::size_t>(C);
    const std::int32_t token = tokens[i];
    if (token < 0 || token >= rows) continue;
    const float e = wte[static_cast<std::size_t>(token) * C + c];
    out[j] = wpe != nullptr ? e + wpe[(i % static_cast<std::size_t>(T)) * C + c] : e;
  }
}

// One thread per column: tokens in order, as the CPU's serial loop adds them.
__global__ void embedding_backward_wte_kernel(float* dwte, const float* dout, const std::int32_t* tokens,
                                              std::size_t N, int C, int rows) {
  for (std::size_t c = global_thread(); c < static_cast<std::size_t>(C); c += grid_threads()) {
    for (std::size_t i = 0; i < N; ++i) {
      const std::int32_t token = tokens[i];
      if (token >= 0 && token < rows) dwte[static_cast<std::size_t>(token) * C + c] += dout[i * C + c];
    }
  }
}

__global__ void embedding_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const std::size_t n = static_cast<std::size_t>(T) * C;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const std::size_t t = j / C, c = j % C;
    for (int b = 0; b < B; ++b) dwpe[j] += dout[(static_cast<std::size_t>(b) * T + t) * C + c];
  }
}

__global__ void gelu_forward_kernel(float* out, const float* in, std::size_t n) {
  constexpr float kS = 0.7978845608028654f, kC = 0.044715f;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const float x = in[j];
    out[j] = 0.5f * x * (1.0f + tanhf(kS * (x + kC * (x * x * x))));
  }
}

__global__ void gelu_backward_kernel(float* d, const float* in, std::size_t n) {
  constexpr float kS = 0.7978845608028654f, kC = 0.044715f;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const float x = in[j];
    const float th = tanhf(kS * (x + kC * (x * x * x)));
    d[j] *= 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kS * (1.0f + 3.0f * kC * (x * x));
  }
}

__global__ void swiglu_forward_kernel(float* out, const float* gate_up, std::size_t n, int H) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const std::size_t i = j / H, c = j % H;
    const float g = gate_up[i * 2 * H + c];
    out[j] = g / (1.0f + expf(-g)) * gate_up[i * 2 * H + H + c];
  }
}

__global__ void swiglu_backward_kernel(float* dgate_up, const float* dout, const float* gate_up, std::size_t n, int H) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const std::size_t i = j / H, c = j % H;
    const float g = gate_up[i * 2 * H + c], u = gate_up[i * 2 * H + H + c];
    const float s = 1.0f / (1.0f + expf(-g));
    dgate_up[i * 2 * H + c] = dout[j] * u * (s * (1.0f + g * (1.0f - s)));
    dgate_up[i * 2 * H + H + c] = dout[j] * (g * s);
  }
}

constexpr int kSumChunks = 32;  // kernels/cpu/model_eigen.hpp

// Row r's term of column j: y (bias), y * (x - mean) * rstd (LayerNorm weight), or
// y * x * rstd (RMSNorm weight, mean == nullptr).
__device__ float column_term(const float* y, const float* x, const float* mean, const float* rstd, std::size_t r,
                             int M, int j) {
  const std::size_t k = r * M + j;
  if (x == nullptr) return y[k];
  if (mean == nullptr) return y[k] * x[k] * rstd[r];
  return y[k] * ((x[k] - mean[r]) * rstd[r]);
}

__global__ void column_partials_kernel(float* partial, const float* y, const float* x, const float* mean,
                                       const float* rstd, int N, int M, int chunks) {
  const std::size_t n = static_cast<std::size_t>(chunks) * M;
  for (std::size_t t = global_thread(); t < n; t += grid_threads()) {
    const int c = static_cast<int>(t / M), j = static_cast<int>(t % M);
    const std::size_t lo = static_cast<std::size_t>(N) * c / chunks,
                      hi = static_cast<std::size_t>(N) * (c + 1) / chunks;
    float acc = 0.0f;
    for (std::size_t r = lo; r < hi; ++r) acc += column_term(y, x, mean, rstd, r, M, j);
    partial[t] = acc;
  }
}

__global__ void column_total_kernel(float* out, const float* partial, int M, int chunks) {
  for (std::size_t j = global_thread(); j < static_cast<std::size_t>(M); j += grid_threads()) {
    for (int c = 0; c < chunks; ++c) out[j] += partial[static_cast<std::size_t>(c) * M + j];
  }
}

// out[j] += sum over rows r of column_term(r, j): chunk c sums its rows in order from 0, then
// the chunks are added to out in chunk order, exactly the CPU's association.
void column_sums_add(float* out, const float* y, const float* x, const float* mean, const float* rstd, int N, int M) {
  if (N == 0 || M == 0) return;
  const int chunks = N < kSumChunks ? N : kSumChunks;
  Scratch<float> partial(static_cast<std::size_t>(chunks) * M, current_stream());
  launch(column_partials_kernel, static_cast<std::size_t>(chunks) * M, partial.get(), y, x, mean, rstd, N, M, chunks);
  launch(column_total_kernel, static_cast<std::size_t>(M), out, static_cast<const float*>(partial.get()), M, chunks);
}

// One warp per row of LayerNorm (mean != nullptr) or RMSNorm (mean == nullptr, b == nullptr).
__global__ void norm_forward_kernel(float* out, float* mean, float* rstd, const float* x, const float* w,
                                    const float* b, int N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  for (int i = static_cast<int>(global_thread() / 32); i < N; i += warps) {
    const float* xi = x + static_cast<std::size_t>(i) * C;
    float m = 0.0f;
    if (mean != nullptr) {
      for (int j = lane; j < C; j += 32) m += xi[j];
      m = warp_sum(m) / static_cast<float>(C);
    }
    float sq = 0.0f;
    for (int j = lane; j < C; j += 32) sq += (xi[j] - m) * (xi[j] - m);
    const float s = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
    float* yi = out + static_cast<std::size_t>(i) * C;
    for (int j = lane; j < C; j += 32) yi[j] = b != nullptr ? (xi[j] - m) * s * w[j] + b[j] : xi[j] * s * w[j];
    if (lane == 0) {
      if (mean != nullptr) mean[i] = m;
      rstd[i] = s;
    }
  }
}

// dx += LayerNorm's (g - mean(g) - norm mean(g norm)) rstd or RMSNorm's (g - x r^2 mean(g x)) r,
// with g = dy * w and norm = (x - mean) rstd.
__global__ void norm_backward_kernel(float* dx, const float* dout, const float* x, const float* w, const float* mean,
                                     const float* rstd, int N, int C) {
  const int lane = threadIdx.x & 31;
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  for (int i = static_cast<int>(global_thread() / 32); i < N; i += warps) {
    const std::size_t row = static_cast<std::size_t>(i) * C;
    const float r = rstd[i], m = mean != nullptr ? mean[i] : 0.0f;
    float g_sum = 0.0f, gn_sum = 0.0f;
    for (int j = lane; j < C; j += 32) {
      const float g = dout[row + j] * w[j];
      g_sum += g;
      gn_sum += mean != nullptr ? g * ((x[row + j] - m) * r) : g * x[row + j];
    }
    const float g_mean = warp_sum(g_sum) / static_cast<float>(C), gn_mean = warp_sum(gn_sum) / static_cast<float>(C);
    for (int j = lane; j < C; j += 32) {
      const float g = dout[row + j] * w[j];
      if (mean != nullptr) {
        dx[row + j] += (g - g_mean - ((x[row + j] - m) * r) * gn_mean) * r;
      } else {
        dx[row + j] += (g - x[row + j] * (r * r * gn_mean)) * r;
      }
    }
  }
}

// One warp per row: loss = log(sum exp(z - max)) + max - z[target]; with the gradient the row
// becomes (softmax - onehot) / N, tails below the smallest normal float flushed as on the CPU.
__global__ void cross_entropy_kernel(float* logits, float* row_loss, const std::int32_t* targets, int N, int V,
                                     bool with_gradient) {
  const int lane = threadIdx.x & 31;
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  const float inv_n = 1.0f / static_cast<float>(N);
  for (int i = static_cast<int>(global_thread() / 32); i < N; i += warps) {
    float* z = logits + static_cast<std::size_t>(i) * V;
    const std::int32_t target = targets[i];
    if (target < 0 || target >= V) {
      if (lane == 0) row_loss[i] = 0.0f;
      continue;
    }
    float m = -INFINITY;
    for (int j = lane; j < V; j += 32) m = fmaxf(m, z[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < V; j += 32) sum += expf(z[j] - m);
    sum = warp_sum(sum);
    const float zt = z[target];
    if (lane == 0) row_loss[i] = logf(sum) + m - zt;
    __syncwarp();
    if (!with_gradient) continue;
    const float factor = inv_n / sum;
    for (int j = lane; j < V; j += 32) {
      float p = flush_subnormal(expf(z[j] - m) * factor);
      if (j == target) p -= inv_n;
      z[j] = p;
    }
  }
}

}  // namespace

void bias_forward(std::span<float> out, std::span<const float> resid, std::span<const float> bias, int N, int M) {
  checks::require_elements(out.size(), checks::elements(N, M), "bias_forward: out");
  if (!resid.empty()) checks::require_elements(resid.size(), out.size(), "bias_forward: resid");
  checks::require_elements(bias.size(), checks::elements(1, M), "bias_forward: bias");
  if (out.empty()) return;
  launch(bias_forward_kernel, out.size(), out.data(), resid.empty() ? nullptr : resid.data(), bias.data(), out.size(),
         M);
}

void bias_backward(std::span<float> dbias, std::span<const float> dy, int N, int M) {
  checks::require_elements(dy.size(), checks::elements(N, M), "bias_backward: dy");
  checks::require_elements(dbias.size(), checks::elements(1, M), "bias_backward: dbias");
  column_sums_add(dbias.data(), dy.data(), nullptr, nullptr, nullptr, N, M);
}

void residual_add(std::span<const float> a, std::span<const float> b, std::span<float> out) {
  checks::require_elements(b.size(), a.size(), "residual_add: b");
  checks::require_elements(out.size(), a.size(), "residual_add: out");
  if (a.empty()) return;
  launch(residual_add_kernel, a.size(), a.data(), b.data(), out.data(), a.size());
}

void embedding_forward(std::span<float> out, std::span<const float> wte, std::span<const float> wpe,
                       std::span<const std::int32_t> tokens, int B, int T, int C) {
  checks::embedding("embedding_forward", B, T, C, out.size(), "out", tokens.size(), !wpe.empty(), wpe.size(), "wpe");
  if (out.empty()) return;
  launch(embedding_forward_kernel, out.size(), out.data(), wte.data(), wpe.empty() ? nullptr : wpe.data(),
         tokens.data(), T, C, out.size(), static_cast<int>(wte.size() / C));
}

void embedding_backward(std::span<float> dwte, std::span<float> dwpe, std::span<const float> dout,
                        std::span<const std::int32_t> tokens, int B, int T, int C) {
  const std::size_t N = checks::embedding("embedding_backward", B, T, C, dout.size(), "dout", tokens.size(),
                                          !dwpe.empty(), dwpe.size(), "dwpe");
  if (dout.empty()) return;
  if (!dwpe.empty()) launch(embedding_backward_wpe_kernel, dwpe.size(), dwpe.data(), dout.data(), B, T, C);
  launch(embedding_backward_wte_kernel, static_cast<std::size_t>(C), dwte.data(), dout.data(), tokens.data(), N, C,
         static_cast<int>(dwte.size() / C));
}

void layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd, std::span<const float> x,
                       std::span<const float> w, std::span<const float> b, int N, int C, double eps) {
  checks::rows("layernorm_forward", N, C, out.size(), x.size(), mean.size());
  checks::rows("layernorm_forward", N, C, out.size(), x.size(), rstd.size());
  checks::require_elements(w.size() + b.size(), checks::elements(2, C), "layernorm_forward: w, b");
  if (N == 0) return;
  launch(norm_forward_kernel, static_cast<std::size_t>(N) * 32, out.data(), mean.data(), rstd.data(), x.data(),
         w.data(), b.data(), N, C, static_cast<float>(eps));
}

void layernorm_backward(std::span<float> dx, std::span<float> dw, std::span<float> db, std::span<const float> dout,
                        std::span<const float> x, std::span<const float> w, std::span<const float> mean,
                        std::span<const float> rstd, int N, int C) {
  checks::rows("layernorm_backward", N, C, dx.size(), x.size(), mean.size());
  checks::rows("layernorm_backward", N, C, dout.size(), x.size(), rstd.size());
  checks::require_elements(w.size() + dw.size() + db.size(), checks::elements(3, C), "layernorm_backward: w, dw, db");
  if (N == 0) return;
  launch(norm_backward_kernel, static_cast<std::size_t>(N) * 32, dx.data(), dout.data(), x.data(), w.data(),
         mean.data(), rstd.data(), N, C);
  column_sums_add(dw.data(), dout.data(), x.data(), mean.data(), rstd.data(), N, C);
  column_sums_add(db.data(), dout.data(), nullptr, nullptr, nullptr, N, C);
}

void rmsnorm_forward(std::span<float> out, std::span<float> rrms, std::span<const float> x, std::span<const float> w,
                     int N, int C, double eps) {
  checks::rows("rmsnorm_forward", N, C, out.size(), x.size(), rrms.size());
  checks::require_elements(w.size(), checks::elements(1, C), "rmsnorm_forward: w");
  if (N == 0) return;
  launch(norm_forward_kernel, static_cast<std::size_t>(N) * 32, out.data(), static_cast<float*>(nullptr), rrms.data(),
         x.data(), w.data(), static_cast<const float*>(nullptr), N, C, static_cast<float>(eps));
}

void rmsnorm_backward(std::span<float> dx, std::span<float> dw, std::span<const float> dout, std::span<const float> x,
                      std::span<const float> w, std::span<const float> rrms, int N, int C) {
  checks::rows("rmsnorm_backward", N, C, dx.size(), x.size(), rrms.size());
  checks::rows("rmsnorm_backward", N, C, dout.size(), x.size(), rrms.size());
  checks::require_elements(w.size() + dw.size(), checks::elements(2, C), "rmsnorm_backward: w, dw");
  if (N == 0) return;
  launch(norm_backward_kernel, static_cast<std::size_t>(N) * 32, dx.data(), dout.data(), x.data(), w.data(),
         static_cast<const float*>(nullptr), rrms.data(), N, C);
  column_sums_add(dw.data(), dout.data(), x.data(), nullptr, rrms.data(), N, C);
}

void gelu_forward(std::span<float> out, std::span<const float> in) {
  checks::require_elements(out.size(), in.size(), "gelu_forward: out");
  if (in.empty()) return;
  launch(gelu_forward_kernel, in.size(), out.data(), in.data(), in.size());
}

void gelu_backward(std::span<float> d, std::span<const float> in) {
  checks::require_elements(d.size(), in.size(), "gelu_backward: d");
  if (in.empty()) return;
  launch(gelu_backward_kernel, in.size(), d.data(), in.data(), in.size());
}

void swiglu_forward(std::span<float> out, std::span<const float> gate_up, int N, int H) {
  checks::require_elements(out.size(), checks::elements(N, H), "swiglu_forward: out");
  checks::require_elements(gate_up.size(), checks::elements(N, 2LL * H), "swiglu_forward: gate_up");
  if (out.empty()) return;
  launch(swiglu_forward_kernel, out.size(), out.data(), gate_up.data(), out.size(), H);
}

void swiglu_backward(std::span<float> dgate_up, std::span<const float> dout, std::span<const float> gate_up, int N,
                     int H) {
  checks::require_elements(dout.size(), checks::elements(N, H), "swiglu_backward: dout");
  checks::require_elements(gate_up.size(), checks::elements(N, 2LL * H), "swiglu_backward: gate_up");
  checks::require_elements(dgate_up.size(), gate_up.size(), "swiglu_backward: dgate_up");
  if (dout.empty()) return;
  launch(swiglu_backward_kernel, dout.size(), dgate_up.data(), dout.data(), gate_up.data(), dout.size(), H);
}

// The row losses come back to the host and are added there in double in row order, as the
// CPU does.
double cross_entropy(std::span<float> logits, std::span<float> row_loss, std::span<const std::int32_t> targets, int N,
                     int V, bool with_gradient) {
  checks::require_elements(logits.size(), checks::elements(N, V), "cross_entropy: logits");
  checks::require_elements(row_loss.size(), checks::elements(N, 1), "cross_entropy: row_loss");
  checks::require_elements(targets.size(), checks::elements(N, 1), "cross_entropy: targets");
  if (N == 0) return std::numeric_limits<double>::quiet_NaN();  // the CPU divides 0 by 0
  launch(cross_entropy_kernel, static_cast<std::size_t>(N) * 32, logits.data(), row_loss.data(), targets.data(), N, V,
         with_gradient);
  std::vector<float> host(static_cast<std::size_t>(N));
  const cudaStream_t stream = current_stream();
  SCAPE_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), row_loss.data(), host.size() * sizeof(float), cudaMemcpyDefault, stream));
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  double total = 0;
  for (const float loss : host) total += static_cast<double>(loss);
  return total / static_cast<double>(N);
}

}  // namespace scape::kernels::cuda
