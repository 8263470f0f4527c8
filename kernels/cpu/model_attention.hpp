// CPU bodies of the GEMM, causal attention and RoPE model ops, templated on the element type
// (float for the backend, double for the gradient check). Contracts:
// kernels/model_kernel_list.inc. Included by kernels/cpu/model_ops.hpp only.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/model_eigen.hpp"
#include "kernels/model_checks.hpp"

namespace scape::kernels::model_cpu {

template <class Out, class Left, class Right>
void assign_product(Out&& c, const Left& a, const Right& b, bool accumulate) {
  if (accumulate) {
    c.noalias() += a * b;
  } else {
    c.noalias() = a * b;
  }
}

template <class R>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, std::span<const R> a, std::span<const R> b,
          bool accumulate, std::span<R> c) {
  checks::gemm(M, N, K, a.size(), b.size(), c.size());
  auto C = mat(c.data(), M, N);
  const auto A = mat(a.data(), trans_a ? K : M, trans_a ? M : K);
  const auto B = mat(b.data(), trans_b ? N : K, trans_b ? K : N);
  if (!trans_a && !trans_b) assign_product(C, A, B, accumulate);
  if (!trans_a && trans_b) assign_product(C, A, B.transpose(), accumulate);
  if (trans_a && !trans_b) assign_product(C, A.transpose(), B, accumulate);
  if (trans_a && trans_b) assign_product(C, A.transpose(), B.transpose(), accumulate);
}

// The operands rounded to bf16 (through float for double), then the fp32 (or double) GEMM.
template <class R>
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, std::span<const R> a, std::span<const R> b,
               bool accumulate, std::span<R> c) {
  checks::gemm(M, N, K, a.size(), b.size(), c.size());
  const auto rounded = [](std::span<const R> x) {
    std::vector<R> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<R>(round_to_bf16(static_cast<float>(x[i])));
    return out;
  };
  const std::vector<R> a16 = rounded(a), b16 = rounded(b);
  gemm<R>(trans_a, trans_b, M, N, K, a16, b16, accumulate, c);
}

// ---- causal self-attention ----------------------------------------------------------------
// Per (b, h): S = q k^T over the lower triangle only, A = softmax(S / sqrt(hs)) row by row over
// keys 0..t, y = A v. A is kept for the backward pass; its upper triangle is never read.

// Query head h of sequence b and the key/value head it reads. In the packed qkv buffer its q,
// k and v are T x hs blocks with rows qkv_width apart (dqkv has the same layout); its rows of
// y and dy start at y_offset, y_width apart.
template <class R>
struct AttentionHead {
  AttentionHead(const R* qkv, Index b, Index h, const AttentionShape& s)
      : hs(s.hs),
        kv_head(h / (s.H / s.Hkv)),
        q_offset(b * s.T * s.qkv_width() + h * hs),
        k_offset(b * s.T * s.qkv_width() + (s.H + kv_head) * hs),
        v_offset(b * s.T * s.qkv_width() + (s.H + s.Hkv + kv_head) * hs),
        y_offset(b * s.T * s.y_width() + h * hs),
        q(mat(qkv + q_offset, s.T, hs, s.qkv_width())),
        k(mat(qkv + k_offset, s.T, hs, s.qkv_width())),
        v(mat(qkv + v_offset, s.T, hs, s.qkv_width())) {}
  Index hs, kv_head, q_offset, k_offset, v_offset, y_offset;
  ConstMatView<R> q, k, v;
};

template <class R>
void attention_forward(std::span<R> y, std::span<R> att, std::span<const R> qkv, const AttentionShape& s) {
  checks::attention(s, y.size(), att.size(), qkv.size());
  const Index T = s.T, H = s.H;
  const R scale = R(1) / std::sqrt(R(s.hs));
#pragma omp parallel for schedule(static) if (parallel_worth(double(s.B) * T * T * s.y_width()))
  for (Index bh = 0; bh < s.B * H; ++bh) {
    const AttentionHead<R> head(qkv.data(), bh / H, bh % H, s);
    R* a = att.data() + bh * T * T;
    auto A = mat(a, T, T);
    A.template triangularView<Eigen::Lower>() = head.q * head.k.transpose();
    for (Index t = 0; t < T; ++t) {
      VecView<R> row(a + t * T, t + 1);
      const R m = row.maxCoeff();
      row = ((row - m) * scale).exp();
      row *= R(1) / ordered_sum(row);
      flush_subnormal(row);
    }
    mat(y.data() + head.y_offset, T, head.hs, s.y_width()).noalias() =
        A.template triangularView<Eigen::Lower>() * head.v;
  }
}

// One (b, key/value head) at a time: its query heads run in order, the first one writing dk
// and dv and the others adding to them, so no two threads touch the same rows.
template <class R>
void attention_backward(std::span<R> dqkv, std::span<R> datt, std::span<const R> dy, std::span<const R> att,
                        std::span<const R> qkv, const AttentionShape& s) {
  checks::attention(s, dy.size(), att.size(), qkv.size());
  checks::require_elements(dqkv.size(), qkv.size(), "attention_backward: dqkv");
  checks::require_elements(datt.size(), att.size(), "attention_backward: datt");
  const Index T = s.T, H = s.H, group = s.H / s.Hkv, S = s.qkv_width();
  const R scale = R(1) / std::sqrt(R(s.hs));
#pragma omp parallel for schedule(static) if (parallel_worth(double(s.B) * T * T * s.y_width()))
  for (Index bkv = 0; bkv < s.B * s.Hkv; ++bkv) {
    for (Index g = 0; g < group; ++g) {
      const Index b = bkv / s.Hkv, h = (bkv % s.Hkv) * group + g, bh = b * H + h;
      const AttentionHead<R> head(qkv.data(), b, h, s);
      const Index hs = head.hs;
      const auto dY = mat(dy.data() + head.y_offset, T, hs, s.y_width());
      const R* a = att.data() + bh * T * T;
      R* da = datt.data() + bh * T * T;
      const auto A = mat(a, T, T);
      auto dA = mat(da, T, T);
      dA.template triangularView<Eigen::Lower>() = dY * head.v.transpose();
      assign_product(mat(dqkv.data() + head.v_offset, T, hs, S), A.template triangularView<Eigen::Lower>().transpose(),
                     dY, g > 0);
      // Softmax backward in place: dS = A * (dA - <A, dA>_row) * scale.
      for (Index t = 0; t < T; ++t) {
        const ConstVecView<R> arow(a + t * T, t + 1);
        VecView<R> drow(da + t * T, t + 1);
        const R dot = ordered_sum(arow * drow);
        drow = arow * (drow - dot) * scale;
        flush_subnormal(drow);
      }
      mat(dqkv.data() + head.q_offset, T, hs, S).noalias() = dA.template triangularView<Eigen::Lower>() * head.k;
      assign_product(mat(dqkv.data() + head.k_offset, T, hs, S), dA.template triangularView<Eigen::Lower>().transpose(),
                     head.q, g > 0);
    }
  }
}

// ---- rotary position embedding --------------------------------------------------------------

// Rotates pairs by +angle (direction 1) or -angle (direction -1); cos and sin per (position,
// pair) are tabulated once per call, in double, then rounded.
template <class R>
void rope_rotate(std::span<R> x, int N, int T, int stride, int width, int head_dim, double base, int direction) {
  checks::rope(x.size(), N, T, stride, width, head_dim);
  const Index pairs = head_dim / 2;
  std::vector<R> table(static_cast<std::size_t>(T) * pairs * 2);
  for (Index t = 0; t < T; ++t) {
    for (Index p = 0; p < pairs; ++p) {
      const double angle = static_cast<double>(t) * std::pow(base, -2.0 * static_cast<double>(p) / head_dim);
      table[(t * pairs + p) * 2] = static_cast<R>(std::cos(angle));
      table[(t * pairs + p) * 2 + 1] = static_cast<R>(direction * std::sin(angle));
    }
  }
#pragma omp parallel for schedule(static) if (parallel_worth(double(N) * width))
  for (Index i = 0; i < N; ++i) {
    const R* cs = table.data() + (i % T) * pairs * 2;
    for (Index h0 = 0; h0 < width; h0 += head_dim) {
      R* e = x.data() + i * stride + h0;
      for (Index p = 0; p < pairs; ++p) {
        const R c = cs[2 * p], sn = cs[2 * p + 1], x0 = e[2 * p], x1 = e[2 * p + 1];
        e[2 * p] = x0 * c - x1 * sn;
        e[2 * p + 1] = x0 * sn + x1 * c;
      }
    }
  }
}

template <class R>
void rope_forward(std::span<R> x, int N, int T, int stride, int width, int head_dim, double base) {
  rope_rotate(x, N, T, stride, width, head_dim, base, 1);
}

template <class R>
void rope_backward(std::span<R> dx, int N, int T, int stride, int width, int head_dim, double base) {
  rope_rotate(dx, N, T, stride, width, head_dim, base, -1);
}

}  // namespace scape::kernels::model_cpu
