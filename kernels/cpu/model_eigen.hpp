// Eigen views and helpers shared by the CPU model ops (kernels/cpu/model_ops.hpp and
// model_attention.hpp): row-major matrix maps over flat buffers, the index-ordered sum, the
// subnormal flush and the threshold below which a loop stays on the calling thread.
#pragma once

#include <Eigen/Dense>
#include <limits>

namespace scape::kernels::model_cpu {

using Index = Eigen::Index;

template <class R>
using RowMajor = Eigen::Matrix<R, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class R>
using MatView = Eigen::Map<RowMajor<R>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class R>
using ConstMatView = Eigen::Map<const RowMajor<R>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class R>
using VecView = Eigen::Map<Eigen::Array<R, Eigen::Dynamic, 1>>;
template <class R>
using ConstVecView = Eigen::Map<const Eigen::Array<R, Eigen::Dynamic, 1>>;

// Row-major [rows, cols] view whose rows start `stride` elements apart (heads live inside
// wider rows, e.g. q of head h is columns [h hs, (h+1) hs) of the packed qkv buffer).
template <class R>
MatView<R> mat(R* p, Index rows, Index cols, Index stride) {
  return MatView<R>(p, rows, cols, Eigen::OuterStride<>(stride));
}
template <class R>
ConstMatView<R> mat(const R* p, Index rows, Index cols, Index stride) {
  return ConstMatView<R>(p, rows, cols, Eigen::OuterStride<>(stride));
}
template <class R>
MatView<R> mat(R* p, Index rows, Index cols) {
  return mat(p, rows, cols, cols);
}
template <class R>
ConstMatView<R> mat(const R* p, Index rows, Index cols) {
  return mat(p, rows, cols, cols);
}

// Column sums (bias and norm gradients) are split into this many row chunks whose partials
// are added in chunk order, so the result does not depend on OpenMP scheduling.
constexpr Index kSumChunks = 32;

// Loops over fewer elements than this run on the calling thread: for small models the
// fork/join barrier would cost more than the loop, and on oversubscribed cores much more.
constexpr double kMinParallelWork = 32768;
constexpr bool parallel_worth(double elements) { return elements >= kMinParallelWork; }

// Sum of an array expression in an order fixed by index alone: lane j adds the coefficients
// at j, j + 8, j + 16, ..., then the lanes are added in order. Eigen's vectorized sum() starts
// at the first aligned element, so with 32-byte AVX packets its association moved with where
// a buffer happened to land, and two instances of the same model disagreed in the last bit.
template <class Expr>
typename Expr::Scalar ordered_sum(const Expr& e) {
  using S = typename Expr::Scalar;
  constexpr Index kLanes = 8;
  S lane[kLanes] = {};
  const Index n = e.size();
  for (Index i = 0; i < n; ++i) lane[i % kLanes] += e.coeff(i);
  S total = 0;
  for (Index j = 0; j < kLanes; ++j) total += lane[j];
  return total;
}

template <class Expr>
typename Expr::Scalar ordered_mean(const Expr& e) {
  return ordered_sum(e) / static_cast<typename Expr::Scalar>(e.size());
}

// Values below the smallest normal float become 0. Softmax tails (probabilities below e^-87)
// are subnormal otherwise, and every GEMM that reads a subnormal runs 10-20 times slower on
// x86 (a microcode assist per operation): sharp attention after large AdamS steps made whole
// runs 15x slower. Flushing only these tails keeps the rest of the arithmetic IEEE, unlike
// FTZ/DAZ.
template <class R>
void flush_subnormal(VecView<R> v) {
  v = (v.abs() < std::numeric_limits<R>::min()).select(R(0), v);
}

}  // namespace scape::kernels::model_cpu
