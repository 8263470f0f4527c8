// PowerSGD's low-rank factors and DeMo's chunked transform, top-k and sign step on the GPU
// (kernels/kernel_list.inc, "Low-rank and chunked-DCT compression"): one thread per output
// entry (per chunk for the top-k) running kernels/compressor_math.hpp, the CPU's code, so
// bit-identical. Gram-Schmidt runs on one thread: its columns depend on each other, P has
// rank columns of a tensor's rows, and a parallel reduction would change the CPU's order.
#include "kernels/compressor_math.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels::cuda {
namespace {

__global__ void project_kernel(const float* __restrict__ m, const float* __restrict__ q, float* __restrict__ p,
                               std::size_t cols, std::size_t rank, std::size_t n) {
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    p[e] = compressor::product_entry(m, q, cols, rank, e / rank, e % rank);
  }
}

__global__ void project_t_kernel(const float* __restrict__ m, const float* __restrict__ p, float* __restrict__ q,
                                 std::size_t rows, std::size_t cols, std::size_t rank, std::size_t n) {
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    q[e] = compressor::transposed_product_entry(m, p, rows, cols, rank, e / rank, e % rank);
  }
}

__global__ void residual_kernel(float* __restrict__ m, const float* __restrict__ p, const float* __restrict__ q,
                                float* __restrict__ approx, std::size_t cols, std::size_t rank, std::size_t n) {
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    const float a = compressor::outer_entry(p, q, rank, e / cols, e % cols);
    approx[e] = a;
    m[e] = m[e] - a;
  }
}

__global__ void orthonormalize_kernel(float* p, std::size_t rows, std::size_t rank) {
  if (global_thread() == 0) compressor::orthonormalize(p, rows, rank);
}

__global__ void transform_kernel(const float* __restrict__ x, std::size_t chunk, const float* __restrict__ basis,
                                 bool transpose, float* __restrict__ out, std::size_t n) {
  for (std::size_t e = global_thread(); e < n; e += grid_threads()) {
    out[e] = compressor::transform_entry(x + (e - e % chunk), basis, chunk, transpose, e % chunk);
  }
}

__global__ void chunk_topk_kernel(const float* __restrict__ y, std::size_t n, std::size_t chunk, std::size_t k,
                                  std::uint32_t* __restrict__ idx, float* __restrict__ values, std::size_t chunks) {
  const std::size_t per_chunk = k < chunk ? k : chunk;
  for (std::size_t c = global_thread(); c < chunks; c += grid_threads()) {
    const std::size_t lo = c * chunk;
    const std::size_t len = lo + chunk < n ? chunk : n - lo;
    compressor::chunk_topk(y + lo, len, k < len ? k : len, static_cast<std::uint32_t>(lo), idx + c * per_chunk,
                           values + c * per_chunk);
  }
}

__global__ void sign_descent_kernel(float* __restrict__ theta, const float* __restrict__ u, float lr, std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads())
    theta[j] = compressor::sign_descent(theta[j], u[j], lr);
}

}  // namespace

void lowrank_project(std::span<const float> m, std::size_t rows, std::size_t cols, std::span<const float> q,
                     std::span<float> p) {
  const std::size_t rank =
      checks::lowrank_sizes(m.size(), rows, cols, q.size(), cols, p.size(), rows, "lowrank_project");
  if (p.empty()) return;
  launch(project_kernel, p.size(), m.data(), q.data(), p.data(), cols, rank, p.size());
}

void lowrank_project_t(std::span<const float> m, std::size_t rows, std::size_t cols, std::span<const float> p,
                       std::span<float> q) {
  const std::size_t rank =
      checks::lowrank_sizes(m.size(), rows, cols, p.size(), rows, q.size(), cols, "lowrank_project_t");
  if (q.empty()) return;
  launch(project_t_kernel, q.size(), m.data(), p.data(), q.data(), rows, cols, rank, q.size());
}

void lowrank_residual(std::span<float> m, std::size_t rows, std::size_t cols, std::span<const float> p,
                      std::span<const float> q, std::span<float> approx) {
  const std::size_t rank =
      checks::lowrank_sizes(m.size(), rows, cols, p.size(), rows, q.size(), cols, "lowrank_residual");
  checks::require_size(approx.size(), m.size(), "lowrank_residual: approx");
  launch(residual_kernel, m.size(), m.data(), p.data(), q.data(), approx.data(), cols, rank, m.size());
}

void orthonormalize_columns(std::span<float> p, std::size_t rows) {
  checks::orthonormalize_sizes(p.size(), rows);
  if (p.empty()) return;
  orthonormalize_kernel<<<1, 1, 0, current_stream()>>>(p.data(), rows, p.size() / rows);
  SCAPE_CUDA_CHECK_LAUNCH();
}

void chunk_transform(std::span<const float> x, std::size_t chunk, std::span<const float> basis, bool transpose,
                     std::span<float> out) {
  checks::chunk_transform_sizes(x.size(), chunk, basis.size(), out.size());
  if (x.empty()) return;
  launch(transform_kernel, x.size(), x.data(), chunk, basis.data(), transpose, out.data(), x.size());
}

void chunk_topk(std::span<const float> y, std::size_t chunk, std::size_t k, std::span<std::uint32_t> idx,
                std::span<float> values) {
  checks::chunk_topk_sizes(y.size(), chunk, k, idx.size(), values.size());
  const std::size_t chunks = (y.size() + chunk - 1) / chunk;
  if (chunks == 0) return;
  launch(chunk_topk_kernel, chunks, y.data(), y.size(), chunk, k, idx.data(), values.data(), chunks);
}

void sign_descent(std::span<float> theta, std::span<const float> u, float lr) {
  checks::require_same(theta.size(), u.size(), "sign_descent: theta/u");
  if (theta.empty()) return;
  launch(sign_descent_kernel, theta.size(), theta.data(), u.data(), lr, theta.size());
}

}  // namespace scape::kernels::cuda
