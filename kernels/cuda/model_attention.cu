// CUDA bodies of causal attention and RoPE (kernels/model_kernel_list.inc; the GEMMs are in
// model_gemm.cu). Attention keeps the CPU's [B H T T] probability buffer and
// runs as straightforward kernels: scores, a row softmax (one warp per row, max subtracted),
// and the value, query and key products with one thread per output element; grouped-query
// heads are mapped by index, and dk/dv sum their query heads in head order.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/model_rows.cuh"
#include "kernels/model_checks.hpp"

namespace scape::kernels::cuda {
namespace {

// AttentionShape's widths, for device code.
__host__ __device__ inline int qkv_cols(const AttentionShape& s) { return (s.H + 2 * s.Hkv) * s.hs; }
__host__ __device__ inline int y_cols(const AttentionShape& s) { return s.H * s.hs; }

// Element (b, t, column) of a [B T, width] buffer.
__device__ inline std::size_t at(int b, int t, int T, int width, int column) {
  return (static_cast<std::size_t>(b) * T + t) * width + column;
}

// Entry e of a [B, H, T, T] score buffer.
struct ScoreIndex {
  int b, h, t, key;
};
__device__ inline ScoreIndex score_index(std::size_t e, const AttentionShape& s) {
  const std::size_t TT = static_cast<std::size_t>(s.T) * s.T;
  return {static_cast<int>(e / (TT * s.H)), static_cast<int>(e / TT % s.H), static_cast<int>(e / s.T % s.T),
          static_cast<int>(e % s.T)};
}

// Entry e of a [B, T, heads, hs] buffer.
struct HeadIndex {
  int b, t, h, d;
};
__device__ inline HeadIndex head_index(std::size_t e, int heads, const AttentionShape& s) {
  const std::size_t row = static_cast<std::size_t>(heads) * s.hs;
  return {static_cast<int>(e / (row * s.T)), static_cast<int>(e / row % s.T), static_cast<int>(e / s.hs % heads),
          static_cast<int>(e % s.hs)};
}

// Raw scores q_t . k_s for s <= t, one thread each; the upper triangle is left untouched.
__global__ void scores_kernel(float* att, const float* qkv, AttentionShape s) {
  const std::size_t n = static_cast<std::size_t>(s.B) * s.H * s.T * s.T;
  const int S = qkv_cols(s), group = s.H / s.Hkv;
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const auto [b, h, t, key] = score_index(e, s);
    if (key > t) continue;
    const float* q = qkv + at(b, t, s.T, S, h * s.hs);
    const float* k = qkv + at(b, key, s.T, S, (s.H + h / group) * s.hs);
    float dot = 0.0f;
    for (int d = 0; d < s.hs; ++d) dot += q[d] * k[d];
    att[e] = dot;
  }
}

// Row t of each (b, h): p = exp((x - max) scale) / sum, tails flushed as on the CPU.
__global__ void softmax_kernel(float* att, int rows, int T, float scale) {
  const int lane = threadIdx.x & 31;
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  for (int r = static_cast<int>(global_thread() / 32); r < rows; r += warps) {
    float* row = att + static_cast<std::size_t>(r) * T;
    const int len = r % T + 1;
    float m = -INFINITY;
    for (int j = lane; j < len; j += 32) m = fmaxf(m, row[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < len; j += 32) sum += expf((row[j] - m) * scale);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int j = lane; j < len; j += 32) row[j] = flush_subnormal(expf((row[j] - m) * scale) * inv);
  }
}

// y[b, t, h, d] = sum_{s <= t} A[b, h, t, s] v[b, s, h / group, d].
__global__ void attend_values_kernel(float* y, const float* att, const float* qkv, AttentionShape s) {
  const std::size_t n = static_cast<std::size_t>(s.B) * s.T * s.H * s.hs;
  const int S = qkv_cols(s), group = s.H / s.Hkv;
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const auto [b, t, h, d] = head_index(e, s.H, s);
    const float* a = att + ((static_cast<std::size_t>(b) * s.H + h) * s.T + t) * s.T;
    const int v_col = (s.H + s.Hkv + h / group) * s.hs + d;
    float acc = 0.0f;
    for (int key = 0; key <= t; ++key) acc += a[key] * qkv[at(b, key, s.T, S, v_col)];
    y[e] = acc;
  }
}

// dA[b, h, t, s] = dy_t . v_s for s <= t.
__global__ void grad_probs_kernel(float* datt, const float* dy, const float* qkv, AttentionShape s) {
  const std::size_t n = static_cast<std::size_t>(s.B) * s.H * s.T * s.T;
  const int S = qkv_cols(s), group = s.H / s.Hkv;
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const auto [b, h, t, key] = score_index(e, s);
    if (key > t) continue;
    const float* g = dy + at(b, t, s.T, y_cols(s), h * s.hs);
    const float* v = qkv + at(b, key, s.T, S, (s.H + s.Hkv + h / group) * s.hs);
    float dot = 0.0f;
    for (int d = 0; d < s.hs; ++d) dot += g[d] * v[d];
    datt[e] = dot;
  }
}

// In place: dS = A (dA - <A, dA>_row) scale, tails flushed.
__global__ void softmax_backward_kernel(float* datt, const float* att, int rows, int T, float scale) {
  const int lane = threadIdx.x & 31;
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  for (int r = static_cast<int>(global_thread() / 32); r < rows; r += warps) {
    const float* a = att + static_cast<std::size_t>(r) * T;
    float* da = datt + static_cast<std::size_t>(r) * T;
    const int len = r % T + 1;
    float dot = 0.0f;
    for (int j = lane; j < len; j += 32) dot += a[j] * da[j];
    dot = warp_sum(dot);
    __syncwarp();
    for (int j = lane; j < len; j += 32) da[j] = flush_subnormal(a[j] * (da[j] - dot) * scale);
  }
}

// dq[b, t, h, d] = sum_{s <= t} dS[b, h, t, s] k[b, s, h / group, d].
__global__ void grad_query_kernel(float* dqkv, const float* dS, const float* qkv, AttentionShape s) {
  const std::size_t n = static_cast<std::size_t>(s.B) * s.T * s.H * s.hs;
  const int S = qkv_cols(s), group = s.H / s.Hkv;
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const auto [b, t, h, d] = head_index(e, s.H, s);
    const float* ds = dS + ((static_cast<std::size_t>(b) * s.H + h) * s.T + t) * s.T;
    const int k_col = (s.H + h / group) * s.hs + d;
    float acc = 0.0f;
    for (int key = 0; key <= t; ++key) acc += ds[key] * qkv[at(b, key, s.T, S, k_col)];
    dqkv[at(b, t, s.T, S, h * s.hs + d)] = acc;
  }
}

// For key/value head kvh at position p: dk = sum_h sum_{t >= p} dS[h, t, p] q[t, h] and
// dv = sum_h sum_{t >= p} A[h, t, p] dy[t, h], over the group's query heads h in order.
__global__ void grad_key_value_kernel(float* dqkv, const float* dS, const float* att, const float* dy,
                                      const float* qkv, AttentionShape s) {
  const std::size_t n = static_cast<std::size_t>(s.B) * s.T * s.Hkv * s.hs;
  const int S = qkv_cols(s), group = s.H / s.Hkv;
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const auto [b, p, kvh, d] = head_index(e, s.Hkv, s);
    float dk = 0.0f, dv = 0.0f;
    for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
      const std::size_t base = (static_cast<std::size_t>(b) * s.H + h) * s.T * s.T;
      for (int t = p; t < s.T; ++t) {
        const std::size_t k = base + static_cast<std::size_t>(t) * s.T + p;
        dk += dS[k] * qkv[at(b, t, s.T, S, h * s.hs + d)];
        dv += att[k] * dy[at(b, t, s.T, y_cols(s), h * s.hs + d)];
      }
    }
    dqkv[at(b, p, s.T, S, (s.H + kvh) * s.hs + d)] = dk;
    dqkv[at(b, p, s.T, S, (s.H + s.Hkv + kvh) * s.hs + d)] = dv;
  }
}

// One thread per (row, pair); cos and sin in double, rounded once, as the CPU's table.
__global__ void rope_kernel(float* x, int N, int T, int stride, int width, int head_dim, double base, int direction) {
  const int pairs_per_row = width / 2, pairs = head_dim / 2;
  const std::size_t n = static_cast<std::size_t>(N) * pairs_per_row;
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const int i = static_cast<int>(e / pairs_per_row), q = static_cast<int>(e % pairs_per_row);
    const int p = q % pairs;
    const double angle = static_cast<double>(i % T) * pow(base, -2.0 * static_cast<double>(p) / head_dim);
    const float c = static_cast<float>(cos(angle)), sn = static_cast<float>(direction * sin(angle));
    float* pair = x + static_cast<std::size_t>(i) * stride + 2 * q;
    const float x0 = pair[0], x1 = pair[1];
    pair[0] = x0 * c - x1 * sn;
    pair[1] = x0 * sn + x1 * c;
  }
}

void rope_rotate(std::span<float> x, int N, int T, int stride, int width, int head_dim, double base, int direction) {
  checks::rope(x.size(), N, T, stride, width, head_dim);
  if (N == 0 || width == 0) return;
  launch(rope_kernel, static_cast<std::size_t>(N) * (width / 2), x.data(), N, T, stride, width, head_dim, base,
         direction);
}

}  // namespace

void attention_forward(std::span<float> y, std::span<float> att, std::span<const float> qkv,
                       const AttentionShape& shape) {
  checks::attention(shape, y.size(), att.size(), qkv.size());
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.hs));
  const int rows = shape.B * shape.H * shape.T;
  launch(scores_kernel, att.size(), att.data(), qkv.data(), shape);
  launch(softmax_kernel, static_cast<std::size_t>(rows) * 32, att.data(), rows, shape.T, scale);
  launch(attend_values_kernel, y.size(), y.data(), static_cast<const float*>(att.data()), qkv.data(), shape);
}

void attention_backward(std::span<float> dqkv, std::span<float> datt, std::span<const float> dy,
                        std::span<const float> att, std::span<const float> qkv, const AttentionShape& shape) {
  checks::attention(shape, dy.size(), att.size(), qkv.size());
  checks::require_elements(dqkv.size(), qkv.size(), "attention_backward: dqkv");
  checks::require_elements(datt.size(), att.size(), "attention_backward: datt");
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.hs));
  const int rows = shape.B * shape.H * shape.T;
  launch(grad_probs_kernel, datt.size(), datt.data(), dy.data(), qkv.data(), shape);
  launch(softmax_backward_kernel, static_cast<std::size_t>(rows) * 32, datt.data(), att.data(), rows, shape.T, scale);
  launch(grad_query_kernel, dy.size(), dqkv.data(), static_cast<const float*>(datt.data()), qkv.data(), shape);
  launch(grad_key_value_kernel, static_cast<std::size_t>(shape.B) * shape.T * shape.Hkv * shape.hs, dqkv.data(),
         static_cast<const float*>(datt.data()), att.data(), dy.data(), qkv.data(), shape);
}

void rope_forward(std::span<float> x, int N, int T, int stride, int width, int head_dim, double base) {
  rope_rotate(x, N, T, stride, width, head_dim, base, 1);
}

void rope_backward(std::span<float> dx, int N, int T, int stride, int width, int head_dim, double base) {
  rope_rotate(dx, N, T, stride, width, head_dim, base, -1);
}

}  // namespace scape::kernels::cuda
