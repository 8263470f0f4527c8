// PowerSGD's low-rank factors and DeMo's chunked transform, top-k and sign step on the CPU
// (kernels/kernel_list.inc, "Low-rank and chunked-DCT compression"): one output entry per
// iteration of kernels/compressor_math.hpp, shared with the CUDA twins.
#include <algorithm>
#include <vector>

#include "kernels/compressor_math.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

using Index = std::int64_t;

}  // namespace

void lowrank_project(std::span<const float> m, std::size_t rows, std::size_t cols, std::span<const float> q,
                     std::span<float> p) {
  const std::size_t rank =
      checks::lowrank_sizes(m.size(), rows, cols, q.size(), cols, p.size(), rows, "lowrank_project");
  const Index n = static_cast<Index>(rows * rank);
#pragma omp parallel for schedule(static) if (m.size() > 65536)
  for (Index e = 0; e < n; ++e) {
    const auto u = static_cast<std::size_t>(e);
    p[u] = compressor::product_entry(m.data(), q.data(), cols, rank, u / rank, u % rank);
  }
}

void lowrank_project_t(std::span<const float> m, std::size_t rows, std::size_t cols, std::span<const float> p,
                       std::span<float> q) {
  const std::size_t rank =
      checks::lowrank_sizes(m.size(), rows, cols, p.size(), rows, q.size(), cols, "lowrank_project_t");
  // Blocks of columns, each walking M row by row (a column walk would stride through memory):
  // every output still adds its terms in row order from 0.0, as
  // compressor::transposed_product_entry (and the CUDA twin) does.
  constexpr std::size_t kBlock = 256;
  const Index blocks = static_cast<Index>((cols + kBlock - 1) / kBlock);
#pragma omp parallel if (m.size() > 65536)
  {
    std::vector<double> sum(kBlock * rank);
#pragma omp for schedule(static)
    for (Index b = 0; b < blocks; ++b) {
      const std::size_t lo = static_cast<std::size_t>(b) * kBlock;
      const std::size_t width = lo + kBlock < cols ? kBlock : cols - lo;
      std::fill(sum.begin(), sum.end(), 0.0);
      for (std::size_t i = 0; i < rows; ++i) {
        const float* row = m.data() + i * cols + lo;
        const float* factor = p.data() + i * rank;
        for (std::size_t j = 0; j < width; ++j) {
          for (std::size_t c = 0; c < rank; ++c) sum[j * rank + c] += static_cast<double>(row[j]) * factor[c];
        }
      }
      for (std::size_t e = 0; e < width * rank; ++e) q[lo * rank + e] = static_cast<float>(sum[e]);
    }
  }
}

void lowrank_residual(std::span<float> m, std::size_t rows, std::size_t cols, std::span<const float> p,
                      std::span<const float> q, std::span<float> approx) {
  const std::size_t rank =
      checks::lowrank_sizes(m.size(), rows, cols, p.size(), rows, q.size(), cols, "lowrank_residual");
  checks::require_size(approx.size(), m.size(), "lowrank_residual: approx");
  const Index n = static_cast<Index>(m.size());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index e = 0; e < n; ++e) {
    const auto u = static_cast<std::size_t>(e);
    const float a = compressor::outer_entry(p.data(), q.data(), rank, u / cols, u % cols);
    approx[u] = a;
    m[u] = m[u] - a;
  }
}

void orthonormalize_columns(std::span<float> p, std::size_t rows) {
  checks::orthonormalize_sizes(p.size(), rows);
  compressor::orthonormalize(p.data(), rows, p.size() / rows);
}

void chunk_transform(std::span<const float> x, std::size_t chunk, std::span<const float> basis, bool transpose,
                     std::span<float> out) {
  checks::chunk_transform_sizes(x.size(), chunk, basis.size(), out.size());
  // The matrix applied, A[j][f] (entry f of the output takes A[j][f] x[j]), laid out so the
  // innermost loop runs over f: each output still sums its terms in j order from 0.0, as
  // compressor::transform_entry (and the CUDA twin) does, but the f lanes vectorize.
  std::vector<float> applied(chunk * chunk);
  for (std::size_t f = 0; f < chunk; ++f) {
    for (std::size_t j = 0; j < chunk; ++j)
      applied[j * chunk + f] = transpose ? basis[j * chunk + f] : basis[f * chunk + j];
  }
  const Index chunks = static_cast<Index>(x.size() / chunk);
#pragma omp parallel if (x.size() > 65536)
  {
    std::vector<double> sum(chunk);
#pragma omp for schedule(static)
    for (Index c = 0; c < chunks; ++c) {
      const std::size_t lo = static_cast<std::size_t>(c) * chunk;
      std::fill(sum.begin(), sum.end(), 0.0);
      for (std::size_t j = 0; j < chunk; ++j) {
        const double xj = x[lo + j];
        const float* row = applied.data() + j * chunk;
        for (std::size_t f = 0; f < chunk; ++f) sum[f] += static_cast<double>(row[f]) * xj;
      }
      for (std::size_t f = 0; f < chunk; ++f) out[lo + f] = static_cast<float>(sum[f]);
    }
  }
}

void chunk_topk(std::span<const float> y, std::size_t chunk, std::size_t k, std::span<std::uint32_t> idx,
                std::span<float> values) {
  checks::chunk_topk_sizes(y.size(), chunk, k, idx.size(), values.size());
  const std::size_t n = y.size();
  const Index chunks = static_cast<Index>((n + chunk - 1) / chunk);
  const std::size_t per_chunk = k < chunk ? k : chunk;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index c = 0; c < chunks; ++c) {
    const std::size_t lo = static_cast<std::size_t>(c) * chunk;
    const std::size_t len = lo + chunk < n ? chunk : n - lo;
    const std::size_t at = static_cast<std::size_t>(c) * per_chunk;
    compressor::chunk_topk(y.data() + lo, len, k < len ? k : len, static_cast<std::uint32_t>(lo), idx.data() + at,
                           values.data() + at);
  }
}

void sign_descent(std::span<float> theta, std::span<const float> u, float lr) {
  checks::require_same(theta.size(), u.size(), "sign_descent: theta/u");
  const Index n = static_cast<Index>(theta.size());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index j = 0; j < n; ++j) {
    const auto s = static_cast<std::size_t>(j);
    theta[s] = compressor::sign_descent(theta[s], u[s], lr);
  }
}

}  // namespace scape::kernels
