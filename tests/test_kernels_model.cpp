// The model ops (kernels/model_kernel_list.inc) on the CPU: the float backend against closed
// forms and hand-computed values, the backward ops against central finite differences in
// double (CpuModelOps<double>, the same bodies), and the size checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/model_ops.hpp"
#include "util/rng.hpp"

namespace sk = scape::kernels;
using Vec = std::vector<double>;
using FVec = std::vector<float>;

namespace {

sk::CpuModelOps<double> ops64;
sk::KernelBackend& ops32() { return sk::cpu_backend(); }

Vec normals(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * scape::rng::normal(seed, i);
  return v;
}

FVec to_float(const Vec& v) { return FVec(v.begin(), v.end()); }

double dot(const Vec& a, const Vec& b) { return std::inner_product(a.begin(), a.end(), b.begin(), 0.0); }

// Checks analytic[j] == d loss / d x[j] by central differences, for every j.
void check_gradient(Vec& x, const Vec& analytic, const std::function<double()>& loss, const char* what,
                    double tol = 1e-6) {
  REQUIRE(analytic.size() == x.size());
  constexpr double h = 1e-5;
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double keep = x[j];
    x[j] = keep + h;
    const double up = loss();
    x[j] = keep - h;
    const double down = loss();
    x[j] = keep;
    const double numeric = (up - down) / (2 * h);
    INFO(what << " coordinate " << j);
    CHECK(analytic[j] == doctest::Approx(numeric).epsilon(tol).scale(1.0));
  }
}

}  // namespace

TEST_CASE("gemm: every transpose combination, assign and accumulate, equals the triple loop") {
  const int M = 5, N = 7, K = 3;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const Vec a = normals(M * K, 1), b = normals(K * N, 2);
      auto A = [&](int i, int k) { return ta ? a[k * M + i] : a[i * K + k]; };
      auto B = [&](int k, int j) { return tb ? b[j * K + k] : b[k * N + j]; };
      Vec c(M * N, 0.5);
      ops64.gemm(ta, tb, M, N, K, a, b, true, c);
      FVec c32(M * N, 9.0f);
      ops32().gemm(ta, tb, M, N, K, to_float(a), to_float(b), false, c32);
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double want = 0;
          for (int k = 0; k < K; ++k) want += A(i, k) * B(k, j);
          CHECK(c[i * N + j] == doctest::Approx(0.5 + want).epsilon(1e-14));
          CHECK(c32[i * N + j] == doctest::Approx(want).epsilon(1e-5).scale(1.0));
        }
      }
    }
  }
  FVec wrong(3);
  CHECK_THROWS_AS(ops32().gemm(false, false, 2, 2, 2, wrong, wrong, false, wrong), std::invalid_argument);
}

TEST_CASE("gemm_bf16: operands rounded to bf16 (ties to even), products summed in fp32") {
  // bf16 keeps 8 significant bits: 1 + 2^-10 rounds to 1; 1 + 2^-8 lies halfway between 1 and
  // 1 + 2^-7 and goes to the even 1; 1 + 3 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6 and
  // goes to the even 1 + 2^-6. With B = [3, 5, 7] (exact in bf16) each product is exact.
  const FVec a = {1.0f + std::ldexp(1.0f, -10), 1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8)};
  const FVec b = {3, 5, 7};
  FVec c(1, 100.0f);
  ops32().gemm_bf16(false, false, 1, 1, 3, a, b, false, c);
  CHECK(c[0] == 3.0f + 5.0f + 7.0f * (1.0f + std::ldexp(1.0f, -6)));
  ops32().gemm_bf16(false, false, 1, 1, 3, a, b, true, c);
  CHECK(c[0] == 2 * (15.0f + 7.0f * std::ldexp(1.0f, -6)));
  FVec full(1);
  ops32().gemm(false, false, 1, 1, 3, a, b, false, full);
  CHECK(full[0] != c[0] / 2);  // the fp32 GEMM sees the digits bf16 drops

  // Every transpose combination against the triple loop in double on explicitly rounded inputs.
  const int M = 6, N = 5, K = 9;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const FVec a32 = to_float(normals(M * K, 11)), b32 = to_float(normals(K * N, 12));
      auto A = [&](int i, int k) { return double(sk::round_to_bf16(ta ? a32[k * M + i] : a32[i * K + k])); };
      auto B = [&](int k, int j) { return double(sk::round_to_bf16(tb ? b32[j * K + k] : b32[k * N + j])); };
      FVec c32(M * N, 0.0f);
      ops32().gemm_bf16(ta, tb, M, N, K, a32, b32, false, c32);
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double want = 0;
          for (int k = 0; k < K; ++k) want += A(i, k) * B(k, j);
          CHECK(c32[i * N + j] == doctest::Approx(want).epsilon(1e-6).scale(1.0));
        }
      }
    }
  }
}

TEST_CASE("bias, residual add and embedding: hand-computed values, repeated tokens added in order") {
  FVec out(6), resid = {1, 2, 3, 4, 5, 6}, bias = {10, 20, 30};
  ops32().bias_forward(out, resid, bias, 2, 3);
  CHECK(out == FVec{11, 22, 33, 14, 25, 36});
  ops32().bias_forward(out, {}, bias, 2, 3);
  CHECK(out == FVec{10, 20, 30, 10, 20, 30});
  FVec db = {1, 1, 1};
  ops32().bias_backward(db, resid, 2, 3);
  CHECK(db == FVec{6, 8, 10});
  FVec sum(6);
  ops32().residual_add(resid, resid, sum);
  CHECK(sum == FVec{2, 4, 6, 8, 10, 12});

  // Vocabulary 3, width 2, B = 2 sequences of T = 2: tokens 2, 0 | 2, 2.
  const FVec wte = {0, 1, 10, 11, 20, 21}, wpe = {100, 200, 300, 400};
  const std::vector<std::int32_t> tokens = {2, 0, 2, 2};
  FVec emb(8);
  ops32().embedding_forward(emb, wte, wpe, tokens, 2, 2, 2);
  CHECK(emb == FVec{120, 221, 300, 401, 120, 221, 320, 421});
  FVec dwte(6), dwpe(4);
  const FVec dout = {1, 2, 3, 4, 5, 6, 7, 8};
  ops32().embedding_backward(dwte, dwpe, dout, tokens, 2, 2, 2);
  CHECK(dwte == FVec{3, 4, 0, 0, 13, 16});
  CHECK(dwpe == FVec{6, 8, 10, 12});
  const std::vector<std::int32_t> bad = {0, 3, 1, 1};
  CHECK_THROWS_AS(ops32().embedding_forward(emb, wte, wpe, bad, 2, 2, 2), std::out_of_range);
}

TEST_CASE("LayerNorm and RMSNorm: normalized rows, backward by finite differences") {
  const int N = 3, C = 5;
  Vec x = normals(N * C, 3, 2.0), w = normals(C, 4), b = normals(C, 5), r = normals(N * C, 6);
  Vec out(N * C), mean(N), rstd(N);
  ops64.layernorm_forward(out, mean, rstd, x, Vec(C, 1.0), Vec(C, 0.0), N, C, 0.0);
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int j = 0; j < C; ++j) m += out[i * C + j] / C;
    for (int j = 0; j < C; ++j) v += out[i * C + j] * out[i * C + j] / C;
    CHECK(std::abs(m) < 1e-14);
    CHECK(v == doctest::Approx(1.0).epsilon(1e-12));
  }
  auto ln_loss = [&] {
    ops64.layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-5);
    return dot(out, r);
  };
  ln_loss();
  Vec dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  ops64.layernorm_backward(dx, dw, db, r, x, w, mean, rstd, N, C);
  check_gradient(x, dx, ln_loss, "layernorm dx");
  check_gradient(w, dw, ln_loss, "layernorm dw");
  check_gradient(b, db, ln_loss, "layernorm db");

  Vec rrms(N);
  ops64.rmsnorm_forward(out, rrms, x, Vec(C, 1.0), N, C, 0.0);
  for (int i = 0; i < N; ++i) {
    double ms = 0;
    for (int j = 0; j < C; ++j) ms += out[i * C + j] * out[i * C + j] / C;
    CHECK(ms == doctest::Approx(1.0).epsilon(1e-12));
  }
  auto rms_loss = [&] {
    ops64.rmsnorm_forward(out, rrms, x, w, N, C, 1e-5);
    return dot(out, r);
  };
  rms_loss();
  Vec rdx(N * C, 0.0), rdw(C, 0.0);
  ops64.rmsnorm_backward(rdx, rdw, r, x, w, rrms, N, C);
  check_gradient(x, rdx, rms_loss, "rmsnorm dx");
  check_gradient(w, rdw, rms_loss, "rmsnorm dw");
}

TEST_CASE("RoPE: interleaved pairs rotate by t * base^(-2p/d); the backward is the transpose") {
  // One row of stride 6 at position t = 1 (T = 2, second row), one head of 4 columns, base 100:
  // pair 0 turns by 1 radian, pair 1 by 1/10; columns 4, 5 are outside `width` and untouched.
  Vec x = {9, 9, 9, 9, 9, 9, 1, 2, 3, 4, 5, 6};
  ops64.rope_forward(x, 2, 2, 6, 4, 4, 100.0);
  CHECK(Vec(x.begin(), x.begin() + 6) == Vec{9, 9, 9, 9, 9, 9});  // t = 0: no rotation
  CHECK(x[6] == doctest::Approx(std::cos(1.0) - 2 * std::sin(1.0)).epsilon(1e-15));
  CHECK(x[7] == doctest::Approx(std::sin(1.0) + 2 * std::cos(1.0)).epsilon(1e-15));
  CHECK(x[8] == doctest::Approx(3 * std::cos(0.1) - 4 * std::sin(0.1)).epsilon(1e-15));
  CHECK(x[9] == doctest::Approx(3 * std::sin(0.1) + 4 * std::cos(0.1)).epsilon(1e-15));
  CHECK(x[10] == 5);
  CHECK(x[11] == 6);
  // <R u, v> == <u, R^T v> over several rows and heads.
  const int N = 6, T = 3, stride = 10, width = 8, hd = 4;
  const Vec u = normals(N * stride, 7), v = normals(N * stride, 8);
  Vec ru = u, rtv = v;
  ops64.rope_forward(ru, N, T, stride, width, hd, 10000.0);
  ops64.rope_backward(rtv, N, T, stride, width, hd, 10000.0);
  CHECK(dot(ru, v) == doctest::Approx(dot(u, rtv)).epsilon(1e-13));
  Vec odd(N * stride);
  CHECK_THROWS_AS(ops64.rope_forward(odd, N, T, stride, 6, 3, 10000.0), std::invalid_argument);
}

TEST_CASE("GELU and SwiGLU: closed forms, backward by finite differences") {
  FVec g(2);
  ops32().gelu_forward(g, FVec{0.0f, 1.0f});
  CHECK(g[0] == 0.0f);
  CHECK(g[1] == doctest::Approx(0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * 1.044715))).epsilon(1e-6));
  Vec x = normals(7, 9, 2.0), r = normals(7, 10), y(7);
  auto gelu_loss = [&] {
    ops64.gelu_forward(y, x);
    return dot(y, r);
  };
  Vec d = r;
  ops64.gelu_backward(d, x);
  check_gradient(x, d, gelu_loss, "gelu");

  FVec s(1);
  ops32().swiglu_forward(s, FVec{2.0f, 3.0f}, 1, 1);
  CHECK(s[0] == doctest::Approx(2.0 / (1 + std::exp(-2.0)) * 3.0).epsilon(1e-6));
  const int N = 2, H = 3;
  Vec gu = normals(N * 2 * H, 11, 2.0), rs = normals(N * H, 12), out(N * H);
  auto swiglu_loss = [&] {
    ops64.swiglu_forward(out, gu, N, H);
    return dot(out, rs);
  };
  Vec dgu(N * 2 * H);
  ops64.swiglu_backward(dgu, rs, gu, N, H);
  check_gradient(gu, dgu, swiglu_loss, "swiglu");
}

// Attention written out per (b, h, t) in double, as the reference.
Vec naive_attention(const Vec& qkv, const sk::AttentionShape& s) {
  Vec y(static_cast<std::size_t>(s.B) * s.T * s.y_width());
  const int S = s.qkv_width(), group = s.H / s.Hkv;
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      for (int t = 0; t < s.T; ++t) {
        Vec p(t + 1);
        for (int k = 0; k <= t; ++k) {
          double dq = 0;
          for (int d = 0; d < s.hs; ++d) {
            dq += qkv[(b * s.T + t) * S + h * s.hs + d] * qkv[(b * s.T + k) * S + (s.H + h / group) * s.hs + d];
          }
          p[k] = std::exp(dq / std::sqrt(double(s.hs)));
        }
        const double z = std::accumulate(p.begin(), p.end(), 0.0);
        for (int d = 0; d < s.hs; ++d) {
          double acc = 0;
          for (int k = 0; k <= t; ++k) acc += p[k] / z * qkv[(b * s.T + k) * S + (s.H + s.Hkv + h / group) * s.hs + d];
          y[(b * s.T + t) * s.y_width() + h * s.hs + d] = acc;
        }
      }
    }
  }
  return y;
}

TEST_CASE("causal attention, multi-head and grouped-query: forward as written out, backward by finite differences") {
  for (const int Hkv : {4, 2, 1}) {
    const sk::AttentionShape s{.B = 2, .T = 5, .H = 4, .Hkv = Hkv, .hs = 3};
    INFO("Hkv = " << Hkv);
    Vec qkv = normals(static_cast<std::size_t>(s.B) * s.T * s.qkv_width(), 13, 1.5);
    const Vec r = normals(static_cast<std::size_t>(s.B) * s.T * s.y_width(), 14);
    Vec y(r.size()), att(static_cast<std::size_t>(s.B) * s.H * s.T * s.T);
    ops64.attention_forward(y, att, qkv, s);
    const Vec want = naive_attention(qkv, s);
    for (std::size_t j = 0; j < y.size(); ++j) CHECK(y[j] == doctest::Approx(want[j]).epsilon(1e-12));
    Vec dqkv(qkv.size(), 7.0), datt(att.size());
    ops64.attention_backward(dqkv, datt, r, att, qkv, s);
    auto loss = [&] {
      ops64.attention_forward(y, att, qkv, s);
      return dot(y, r);
    };
    check_gradient(qkv, dqkv, loss, "attention dqkv");
  }
}

TEST_CASE("softmax cross-entropy: ln V for equal logits, gradient (softmax - onehot) / N by finite differences") {
  const int N = 3, V = 6;
  FVec flat(N * V, 0.25f), rows(N);
  const std::vector<std::int32_t> targets = {0, 5, 2};
  CHECK(ops32().cross_entropy(flat, rows, targets, N, V, false) == doctest::Approx(std::log(6.0)).epsilon(1e-6));
  Vec z = normals(N * V, 15, 3.0), row_loss(N);
  auto loss = [&] {
    Vec copy = z;
    return ops64.cross_entropy(copy, row_loss, targets, N, V, false);
  };
  Vec grad = z;
  const double with_grad = ops64.cross_entropy(grad, row_loss, targets, N, V, true);
  CHECK(with_grad == doctest::Approx(loss()).epsilon(1e-15));
  check_gradient(z, grad, loss, "cross-entropy");
  const std::vector<std::int32_t> bad = {0, 6, 1};
  CHECK_THROWS_AS(ops32().cross_entropy(flat, rows, bad, N, V, false), std::out_of_range);
}
