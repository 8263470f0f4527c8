// GPT-2 forward and hand-written backward on flat buffers: GEMMs through Eigen, everything else
// in OpenMP loops (layer order and gradient formulas follow karpathy/llm.c train_gpt2.c).
#include "model/gpt.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.hpp"

namespace scape::model {

namespace {

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
// wider rows, e.g. q of head h is columns [h hs, (h+1) hs) of the [N, 3C] qkv buffer).
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

constexpr double kLayerNormEps = 1e-5;
// Column sums (bias and LayerNorm gradients) are split into this many row chunks whose partials
// are added in chunk order, so the result does not depend on OpenMP scheduling.
constexpr Index kSumChunks = 32;

// Loops over fewer elements than this run on the calling thread: for small models the fork/join
// barrier would cost more than the loop, and on oversubscribed cores much more.
constexpr double kMinParallelWork = 32768;
constexpr bool parallel_worth(double elements) { return elements >= kMinParallelWork; }

// Slot order inside one block; gpt_layout() adds them in exactly this order.
enum BlockSlot : std::size_t {
  kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kMprojW, kMprojB, kBlockSlots
};
constexpr std::size_t kWte = 0;
constexpr std::size_t kWpe = 1;
constexpr std::size_t kFirstBlock = 2;

// ---- elementwise and row kernels ------------------------------------------------------------

template <class R>
void encoder_forward(R* out, const R* wte, const R* wpe, const std::int32_t* tokens, Index B, Index T, Index C) {
#pragma omp parallel for schedule(static) if (parallel_worth(B * T * C))
  for (Index i = 0; i < B * T; ++i) {
    VecView<R>(out + i * C, C) =
        ConstVecView<R>(wte + tokens[i] * C, C) + ConstVecView<R>(wpe + (i % T) * C, C);
  }
}

template <class R>
void encoder_backward(R* dwte, R* dwpe, const R* dout, const std::int32_t* tokens, Index B, Index T, Index C) {
#pragma omp parallel for schedule(static) if (parallel_worth(B * T * C))
  for (Index t = 0; t < T; ++t) {
    for (Index b = 0; b < B; ++b) VecView<R>(dwpe + t * C, C) += ConstVecView<R>(dout + (b * T + t) * C, C);
  }
  // Serial: repeated tokens scatter into the same row, and the cost is only B T C adds.
  for (Index i = 0; i < B * T; ++i) VecView<R>(dwte + tokens[i] * C, C) += ConstVecView<R>(dout + i * C, C);
}

// Sum of an array expression in an order fixed by index alone: lane j adds the coefficients at
// j, j + 8, j + 16, ..., then the lanes are added in order. Eigen's vectorized sum() starts at the
// first aligned element, so with 32-byte AVX packets its association moved with where a buffer
// happened to land, and two instances of the same model disagreed in the last bit.
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

template <class R>
void layernorm_forward(R* out, R* mean, R* rstd, const R* x, const R* w, const R* b, Index N, Index C) {
  const ConstVecView<R> gain(w, C), bias(b, C);
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (Index i = 0; i < N; ++i) {
    const ConstVecView<R> xi(x + i * C, C);
    const R m = ordered_mean(xi);
    const R var = ordered_mean((xi - m).square());
    const R s = R(1) / std::sqrt(var + R(kLayerNormEps));
    VecView<R>(out + i * C, C) = (xi - m) * s * gain + bias;
    mean[i] = m;
    rstd[i] = s;
  }
}

// Accumulates into dx (the residual stream's gradient), dw and db. `partial` holds
// kSumChunks * 2C scratch values for the per-chunk dw/db sums.
template <class R>
void layernorm_backward(R* dx, R* dw, R* db, const R* dout, const R* x, const R* w, const R* mean, const R* rstd,
                        Index N, Index C, R* partial) {
  const Index chunks = std::min(kSumChunks, N);
  const ConstVecView<R> gain(w, C);
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (Index c = 0; c < chunks; ++c) {
    VecView<R> pw(partial + c * 2 * C, C), pb(partial + c * 2 * C + C, C);
    pw.setZero();
    pb.setZero();
    for (Index i = N * c / chunks; i < N * (c + 1) / chunks; ++i) {
      const ConstVecView<R> xi(x + i * C, C), dyi(dout + i * C, C);
      const auto norm = (xi - mean[i]) * rstd[i];
      const auto dnorm = dyi * gain;
      const R dnorm_mean = ordered_mean(dnorm);
      const R dnorm_norm_mean = ordered_mean(dnorm * norm);
      VecView<R>(dx + i * C, C) += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
      pw += dyi * norm;
      pb += dyi;
    }
  }
  VecView<R> gw(dw, C), gb(db, C);
  for (Index c = 0; c < chunks; ++c) {
    gw += ConstVecView<R>(partial + c * 2 * C, C);
    gb += ConstVecView<R>(partial + c * 2 * C + C, C);
  }
}

// out[j] += sum_i x[i, j] over a row-major [N, M] matrix.
template <class R>
void column_sums_add(R* out, const R* x, Index N, Index M, R* partial) {
  const Index chunks = std::min(kSumChunks, N);
#pragma omp parallel for schedule(static) if (parallel_worth(N * M))
  for (Index c = 0; c < chunks; ++c) {
    VecView<R> acc(partial + c * M, M);
    acc.setZero();
    for (Index i = N * c / chunks; i < N * (c + 1) / chunks; ++i) acc += ConstVecView<R>(x + i * M, M);
  }
  VecView<R> total(out, M);
  for (Index c = 0; c < chunks; ++c) total += ConstVecView<R>(partial + c * M, M);
}

template <class R>
void add_rows(R* out, const R* in, const R* bias, Index N, Index M) {
  const ConstVecView<R> b(bias, M);
#pragma omp parallel for schedule(static) if (parallel_worth(N * M))
  for (Index i = 0; i < N; ++i) {
    if (in != nullptr) {
      VecView<R>(out + i * M, M) = ConstVecView<R>(in + i * M, M) + b;
    } else {
      VecView<R>(out + i * M, M) = b;
    }
  }
}

// GELU, tanh approximation as in GPT-2.
template <class R>
struct GeluConst {
  static constexpr R kS = R(0.7978845608028654);  // sqrt(2/pi)
  static constexpr R kC = R(0.044715);
};

// Elementwise kernels run in fixed chunks so each thread hands Eigen a long vectorisable span.
constexpr Index kElemChunk = 4096;

template <class R>
void gelu_forward(R* out, const R* in, Index n) {
  using K = GeluConst<R>;
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (Index o = 0; o < n; o += kElemChunk) {
    const Index len = std::min(kElemChunk, n - o);
    const ConstVecView<R> x(in + o, len);
    VecView<R>(out + o, len) = R(0.5) * x * (R(1) + (K::kS * (x + K::kC * x.cube())).tanh());
  }
}

// dx = gelu'(x) * dx, in place on the gradient buffer. tanh is needed twice, so it goes through
// a small stack buffer rather than a heap temporary.
template <class R>
void gelu_backward(R* dx, const R* in, Index n) {
  using K = GeluConst<R>;
  constexpr Index kBlock = 256;
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (Index o = 0; o < n; o += kBlock) {
    const Index len = std::min(kBlock, n - o);
    const ConstVecView<R> x(in + o, len);
    VecView<R> d(dx + o, len);
    const Eigen::Array<R, Eigen::Dynamic, 1, 0, kBlock, 1> th = (K::kS * (x + K::kC * x.cube())).tanh();
    d *= R(0.5) * (R(1) + th) + R(0.5) * x * (R(1) - th.square()) * K::kS * (R(1) + R(3) * K::kC * x.square());
  }
}

// ---- linear layers --------------------------------------------------------------------------

// out[N, OC] = (resid or 0) + bias + in[N, IC] W[OC, IC]^T.
template <class R>
void linear_forward(R* out, const R* resid, const R* in, const R* w, const R* bias, Index N, Index IC, Index OC) {
  auto y = mat(out, N, OC);
  if (bias != nullptr) {
    add_rows(out, resid, bias, N, OC);
    y.noalias() += mat(in, N, IC) * mat(w, OC, IC).transpose();
  } else {
    y.noalias() = mat(in, N, IC) * mat(w, OC, IC).transpose();
  }
}

// dW += dY^T X, db += colsum(dY), dX = dY W.
template <class R>
void linear_backward(R* dx, R* dw, R* db, const R* dy, const R* x, const R* w, Index N, Index IC, Index OC,
                     R* partial) {
  mat(dw, OC, IC).noalias() += mat(dy, N, OC).transpose() * mat(x, N, IC);
  if (db != nullptr) column_sums_add(db, dy, N, OC, partial);
  mat(dx, N, IC).noalias() = mat(dy, N, OC) * mat(w, OC, IC);
}

// ---- causal self-attention ------------------------------------------------------------------
// Per (b, h): S = q k^T over the lower triangle only, A = softmax(S / sqrt(hs)) row by row over
// keys 0..t, y = A v. A is kept for the backward pass; its upper triangle is never read.

// Head h of sequence b (bh = b H + h). In the packed [B T 3C] qkv buffer its q, k and v are
// T x hs blocks at qkv_offset, + C and + 2C with rows 3C apart (dqkv has the same layout); its
// rows of the [B T C] y and dy start at y_offset.
template <class R>
struct AttentionHead {
  AttentionHead(const R* qkv, Index bh, Index T, Index C, Index H)
      : hs(C / H),
        qkv_offset((bh / H) * T * 3 * C + (bh % H) * hs),
        y_offset((bh / H) * T * C + (bh % H) * hs),
        q(mat(qkv + qkv_offset, T, hs, 3 * C)),
        k(mat(qkv + qkv_offset + C, T, hs, 3 * C)),
        v(mat(qkv + qkv_offset + 2 * C, T, hs, 3 * C)) {}
  Index hs, qkv_offset, y_offset;
  ConstMatView<R> q, k, v;
};

// Values below the smallest normal float become 0. Softmax tails (probabilities below e^-87) are
// subnormal otherwise, and every GEMM that reads a subnormal runs 10-20 times slower on x86 (a
// microcode assist per operation): sharp attention after large AdamS steps made whole runs 15x
// slower. Flushing only these tails keeps the rest of the arithmetic IEEE, unlike FTZ/DAZ.
template <class R>
void flush_subnormal(VecView<R> v) {
  v = (v.abs() < std::numeric_limits<R>::min()).select(R(0), v);
}

template <class R>
void attention_forward(R* y, R* att, const R* qkv, Index B, Index T, Index C, Index H) {
  const R scale = R(1) / std::sqrt(R(C / H));
#pragma omp parallel for schedule(static) if (parallel_worth(B * T * T * C))
  for (Index bh = 0; bh < B * H; ++bh) {
    const AttentionHead<R> head(qkv, bh, T, C, H);
    R* a = att + bh * T * T;
    auto A = mat(a, T, T);
    A.template triangularView<Eigen::Lower>() = head.q * head.k.transpose();
    for (Index t = 0; t < T; ++t) {
      VecView<R> row(a + t * T, t + 1);
      const R m = row.maxCoeff();
      row = ((row - m) * scale).exp();
      row *= R(1) / ordered_sum(row);
      flush_subnormal(row);
    }
    mat(y + head.y_offset, T, head.hs, C).noalias() = A.template triangularView<Eigen::Lower>() * head.v;
  }
}

// Writes dq, dk, dv into dqkv (every element, so dqkv needs no zeroing); datt is [B H T T] scratch.
template <class R>
void attention_backward(R* dqkv, R* datt, const R* dy, const R* att, const R* qkv, Index B, Index T, Index C,
                        Index H) {
  const R scale = R(1) / std::sqrt(R(C / H));
#pragma omp parallel for schedule(static) if (parallel_worth(B * T * T * C))
  for (Index bh = 0; bh < B * H; ++bh) {
    const AttentionHead<R> head(qkv, bh, T, C, H);
    const Index hs = head.hs;
    R* dbase = dqkv + head.qkv_offset;
    const auto dY = mat(dy + head.y_offset, T, hs, C);
    const R* a = att + bh * T * T;
    R* da = datt + bh * T * T;
    const auto A = mat(a, T, T);
    auto dA = mat(da, T, T);
    dA.template triangularView<Eigen::Lower>() = dY * head.v.transpose();
    mat(dbase + 2 * C, T, hs, 3 * C).noalias() = A.template triangularView<Eigen::Lower>().transpose() * dY;
    // Softmax backward in place: dS = A * (dA - <A, dA>_row) * scale.
    for (Index t = 0; t < T; ++t) {
      const ConstVecView<R> arow(a + t * T, t + 1);
      VecView<R> drow(da + t * T, t + 1);
      const R dot = ordered_sum(arow * drow);
      drow = arow * (drow - dot) * scale;
      flush_subnormal(drow);
    }
    mat(dbase, T, hs, 3 * C).noalias() = dA.template triangularView<Eigen::Lower>() * head.k;
    mat(dbase + C, T, hs, 3 * C).noalias() = dA.template triangularView<Eigen::Lower>().transpose() * head.q;
  }
}

// ---- loss -----------------------------------------------------------------------------------

// Returns the mean cross-entropy. With `grad`, overwrites the logits with dloss/dlogits =
// (softmax - onehot) / N, which is all the backward pass needs from them.
template <class R>
double cross_entropy(R* logits, R* row_loss, const std::int32_t* targets, Index N, Index V, bool grad) {
  const R inv_n = R(1) / R(N);
#pragma omp parallel for schedule(static) if (parallel_worth(N * V))
  for (Index i = 0; i < N; ++i) {
    VecView<R> z(logits + i * V, V);
    const R m = z.maxCoeff();
    const R zt = z[targets[i]];
    if (grad) {
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

enum class InitRule { kNormal, kResidual, kOnes, kZeros };

InitRule init_rule(std::string_view name) {
  const bool is_bias = name.ends_with(".b");
  const bool is_norm = name.starts_with("ln") || name.find(".ln") != std::string_view::npos;
  if (is_bias) return InitRule::kZeros;
  if (is_norm) return InitRule::kOnes;
  if (name.ends_with("attn.proj.w") || name.ends_with("mlp.proj.w")) return InitRule::kResidual;
  return InitRule::kNormal;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

}  // namespace

// ---- config and layout ----------------------------------------------------------------------

void GptConfig::validate() const {
  auto positive = [](int v, const char* field) {
    require(v >= 1, std::string("GptConfig.") + field + " = " + std::to_string(v) + ": must be >= 1");
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  positive(block_size, "block_size");
  positive(vocab_size, "vocab_size");
  require(n_embd % n_head == 0, "GptConfig.n_embd = " + std::to_string(n_embd) +
                                    ": must be a multiple of n_head = " + std::to_string(n_head));
}

ParamLayout gpt_layout(const GptConfig& cfg) {
  cfg.validate();
  const auto C = static_cast<std::size_t>(cfg.n_embd);
  const auto V = static_cast<std::size_t>(cfg.vocab_size);
  const auto T = static_cast<std::size_t>(cfg.block_size);
  ParamLayout layout;
  layout.add("wte", {V, C}, false);
  layout.add("wpe", {T, C}, false);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    layout.add(p + "ln1.w", {C}, false);
    layout.add(p + "ln1.b", {C}, false);
    layout.add(p + "attn.qkv.w", {3 * C, C}, true);
    layout.add(p + "attn.qkv.b", {3 * C}, false);
    layout.add(p + "attn.proj.w", {C, C}, true);
    layout.add(p + "attn.proj.b", {C}, false);
    layout.add(p + "ln2.w", {C}, false);
    layout.add(p + "ln2.b", {C}, false);
    layout.add(p + "mlp.fc.w", {4 * C, C}, true);
    layout.add(p + "mlp.fc.b", {4 * C}, false);
    layout.add(p + "mlp.proj.w", {C, 4 * C}, true);
    layout.add(p + "mlp.proj.b", {C}, false);
  }
  layout.add("lnf.w", {C}, false);
  layout.add("lnf.b", {C}, false);
  return layout;
}

double train_flops_per_token(const GptConfig& cfg, int T) {
  const double L = cfg.n_layer, C = cfg.n_embd, V = cfg.vocab_size;
  const double matmul_weights = 12.0 * L * C * C + V * C;
  return 6.0 * matmul_weights + 6.0 * L * T * C;
}

// ---- workspace ------------------------------------------------------------------------------

// Activations of every layer for one (B, T) shape, kept for the backward pass. Buffers only
// grow, so alternating shapes (train batch, eval batch) reuse the largest allocation.
template <class R>
struct BasicGpt<R>::Workspace {
  // Eigen's GEMMs associate differently with the alignment of their operands, so every buffer
  // starts on the same boundary and a reallocation cannot change a result's last bits.
  using Buffer = std::vector<R, Eigen::aligned_allocator<R>>;
  struct Layer {
    R *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fcg, *res3;
  };

  Buffer ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fcg, res3;
  Buffer res0, lnf, lnf_mean, lnf_rstd, logits, row_loss;
  Buffer dres, dln, dqkv, datty, dfc, datt, partial;
  Index N = 0, C = 0, H = 0, T = 0, L = 0;

  static void fit(Buffer& v, Index n) {
    if (v.size() < static_cast<std::size_t>(n)) v.resize(static_cast<std::size_t>(n));
  }

  void ensure(const GptConfig& cfg, Index batch, Index seq) {
    L = cfg.n_layer;
    C = cfg.n_embd;
    H = cfg.n_head;
    T = seq;
    N = batch * seq;
    const Index V = cfg.vocab_size, attn = batch * H * seq * seq;
    for (auto* v : {&ln1, &atty, &res2, &ln2, &res3}) fit(*v, L * N * C);
    for (auto* v : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd}) fit(*v, L * N);
    fit(qkv, L * N * 3 * C);
    fit(att, L * attn);
    fit(fch, L * N * 4 * C);
    fit(fcg, L * N * 4 * C);
    for (auto* v : {&res0, &lnf, &dres, &dln, &datty}) fit(*v, N * C);
    for (auto* v : {&lnf_mean, &lnf_rstd, &row_loss}) fit(*v, N);
    fit(logits, N * V);
    fit(dqkv, N * 3 * C);
    fit(dfc, N * 4 * C);
    fit(datt, attn);
    fit(partial, kSumChunks * 4 * C);
  }

  Layer layer(Index l) {
    const Index nc = N * C, attn = N / T * H * T * T;
    return Layer{ln1.data() + l * nc,  ln1_mean.data() + l * N, ln1_rstd.data() + l * N, qkv.data() + l * 3 * nc,
                 att.data() + l * attn, atty.data() + l * nc,   res2.data() + l * nc,     ln2.data() + l * nc,
                 ln2_mean.data() + l * N, ln2_rstd.data() + l * N, fch.data() + l * 4 * nc, fcg.data() + l * 4 * nc,
                 res3.data() + l * nc};
  }

  // The residual stream entering block l.
  const R* block_input(Index l) { return l == 0 ? res0.data() : layer(l - 1).res3; }
};

// ---- BasicGpt -------------------------------------------------------------------------------

template <class R>
BasicGpt<R>::BasicGpt(const GptConfig& cfg) : cfg_(cfg), layout_(gpt_layout(cfg)), ws_(std::make_unique<Workspace>()) {}

template <class R>
BasicGpt<R>::~BasicGpt() = default;
template <class R>
BasicGpt<R>::BasicGpt(BasicGpt&&) noexcept = default;
template <class R>
BasicGpt<R>& BasicGpt<R>::operator=(BasicGpt&&) noexcept = default;

template <class R>
void BasicGpt<R>::init_params(std::span<R> params, std::uint64_t seed) const {
  require(params.size() == layout_.size(), "Gpt::init_params: params has " + std::to_string(params.size()) +
                                               " elements, layout needs " + std::to_string(layout_.size()));
  const double residual_std = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  const auto& slots = layout_.slots();
  for (std::size_t s = 0; s < slots.size(); ++s) {
    const InitRule rule = init_rule(slots[s].name);
    R* p = params.data() + slots[s].offset;
    const auto n = static_cast<Index>(slots[s].numel());
    if (rule == InitRule::kZeros || rule == InitRule::kOnes) {
      std::fill(p, p + n, rule == InitRule::kOnes ? R(1) : R(0));
      continue;
    }
    const double std_dev = rule == InitRule::kResidual ? residual_std : 0.02;
    const std::uint64_t key = rng::derive(seed, s);  // one stream per tensor
#pragma omp parallel for schedule(static) if (parallel_worth(n))
    for (Index i = 0; i < n; ++i) {
      p[i] = static_cast<R>(std_dev * rng::normal(key, static_cast<std::uint64_t>(i)));
    }
  }
}

template <class R>
void BasicGpt<R>::check_call(std::span<const R> params, std::span<const std::int32_t> inputs,
                             std::span<const std::int32_t> targets, int B, int T) const {
  require(params.size() == layout_.size(), "Gpt: params has " + std::to_string(params.size()) +
                                               " elements, layout needs " + std::to_string(layout_.size()));
  require(B >= 1, "Gpt: batch size B = " + std::to_string(B) + " must be >= 1");
  require(T >= 1 && T <= cfg_.block_size, "Gpt: sequence length T = " + std::to_string(T) + " must be in [1, " +
                                              std::to_string(cfg_.block_size) + "] (block_size)");
  const auto n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  require(inputs.size() == n && targets.size() == n,
          "Gpt: inputs/targets have " + std::to_string(inputs.size()) + "/" + std::to_string(targets.size()) +
              " tokens, B*T = " + std::to_string(n));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::int32_t tok : {inputs[i], targets[i]}) {
      if (tok < 0 || tok >= cfg_.vocab_size) {
        throw std::out_of_range("Gpt: token " + std::to_string(tok) + " at position " + std::to_string(i) +
                                " is outside [0, vocab_size = " + std::to_string(cfg_.vocab_size) + ")");
      }
    }
  }
}

template <class R>
R BasicGpt<R>::forward(const R* p, const std::int32_t* inputs, const std::int32_t* targets, int batch, int seq,
                       bool grad) {
  Workspace& w = *ws_;
  w.ensure(cfg_, batch, seq);
  const Index B = batch, T = seq, N = w.N, C = w.C, H = w.H, V = cfg_.vocab_size;
  const auto& slots = layout_.slots();
  auto P = [&](std::size_t slot) { return p + slots[slot].offset; };

  encoder_forward(w.res0.data(), P(kWte), P(kWpe), inputs, B, T, C);
  for (Index l = 0; l < w.L; ++l) {
    const std::size_t s = kFirstBlock + static_cast<std::size_t>(l) * kBlockSlots;
    const auto a = w.layer(l);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, w.block_input(l), P(s + kLn1W), P(s + kLn1B), N, C);
    linear_forward<R>(a.qkv, nullptr, a.ln1, P(s + kQkvW), P(s + kQkvB), N, C, 3 * C);
    attention_forward(a.atty, a.att, a.qkv, B, T, C, H);
    linear_forward(a.res2, w.block_input(l), a.atty, P(s + kProjW), P(s + kProjB), N, C, C);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, P(s + kLn2W), P(s + kLn2B), N, C);
    linear_forward<R>(a.fch, nullptr, a.ln2, P(s + kFcW), P(s + kFcB), N, C, 4 * C);
    gelu_forward(a.fcg, a.fch, N * 4 * C);
    linear_forward(a.res3, a.res2, a.fcg, P(s + kMprojW), P(s + kMprojB), N, 4 * C, C);
  }
  const std::size_t f = kFirstBlock + static_cast<std::size_t>(w.L) * kBlockSlots;
  layernorm_forward(w.lnf.data(), w.lnf_mean.data(), w.lnf_rstd.data(), w.block_input(w.L), P(f), P(f + 1), N, C);
  // Tied head: logits = lnf wte^T.
  linear_forward<R>(w.logits.data(), nullptr, w.lnf.data(), P(kWte), nullptr, N, C, V);
  return static_cast<R>(cross_entropy(w.logits.data(), w.row_loss.data(), targets, N, V, grad));
}

template <class R>
void BasicGpt<R>::backward(const R* p, const std::int32_t* inputs, int batch, int seq, R* g) {
  Workspace& w = *ws_;
  const Index B = batch, T = seq, N = w.N, C = w.C, H = w.H, V = cfg_.vocab_size;
  const auto& slots = layout_.slots();
  auto P = [&](std::size_t slot) { return p + slots[slot].offset; };
  auto G = [&](std::size_t slot) { return g + slots[slot].offset; };
  R* partial = w.partial.data();

  // w.logits already holds dloss/dlogits (see cross_entropy).
  linear_backward<R>(w.dln.data(), G(kWte), nullptr, w.logits.data(), w.lnf.data(), P(kWte), N, C, V, partial);
  const std::size_t f = kFirstBlock + static_cast<std::size_t>(w.L) * kBlockSlots;
  std::fill(w.dres.begin(), w.dres.begin() + N * C, R(0));
  layernorm_backward(w.dres.data(), G(f), G(f + 1), w.dln.data(), w.block_input(w.L), P(f), w.lnf_mean.data(),
                     w.lnf_rstd.data(), N, C, partial);

  R *dres = w.dres.data(), *dln = w.dln.data(), *dfc = w.dfc.data(), *datty = w.datty.data(), *dqkv = w.dqkv.data();
  for (Index l = w.L - 1; l >= 0; --l) {
    const std::size_t s = kFirstBlock + static_cast<std::size_t>(l) * kBlockSlots;
    const auto a = w.layer(l);
    linear_backward(dfc, G(s + kMprojW), G(s + kMprojB), dres, a.fcg, P(s + kMprojW), N, 4 * C, C, partial);
    gelu_backward(dfc, a.fch, N * 4 * C);
    linear_backward(dln, G(s + kFcW), G(s + kFcB), dfc, a.ln2, P(s + kFcW), N, C, 4 * C, partial);
    layernorm_backward(dres, G(s + kLn2W), G(s + kLn2B), dln, a.res2, P(s + kLn2W), a.ln2_mean, a.ln2_rstd, N, C,
                       partial);
    linear_backward(datty, G(s + kProjW), G(s + kProjB), dres, a.atty, P(s + kProjW), N, C, C, partial);
    attention_backward(dqkv, w.datt.data(), datty, a.att, a.qkv, B, T, C, H);
    linear_backward(dln, G(s + kQkvW), G(s + kQkvB), dqkv, a.ln1, P(s + kQkvW), N, C, 3 * C, partial);
    layernorm_backward(dres, G(s + kLn1W), G(s + kLn1B), dln, w.block_input(l), P(s + kLn1W), a.ln1_mean,
                       a.ln1_rstd, N, C, partial);
  }
  encoder_backward(G(kWte), G(kWpe), dres, inputs, B, T, C);
}

template <class R>
R BasicGpt<R>::forward_backward(std::span<const R> params, std::span<const std::int32_t> inputs,
                                std::span<const std::int32_t> targets, int B, int T, std::span<R> grads) {
  check_call(params, inputs, targets, B, T);
  require(grads.size() == layout_.size(), "Gpt::forward_backward: grads has " + std::to_string(grads.size()) +
                                              " elements, layout needs " + std::to_string(layout_.size()));
  std::fill(grads.begin(), grads.end(), R(0));
  const R mean_loss = forward(params.data(), inputs.data(), targets.data(), B, T, true);
  backward(params.data(), inputs.data(), B, T, grads.data());
  return mean_loss;
}

template <class R>
R BasicGpt<R>::loss(std::span<const R> params, std::span<const std::int32_t> inputs,
                    std::span<const std::int32_t> targets, int B, int T) {
  check_call(params, inputs, targets, B, T);
  return forward(params.data(), inputs.data(), targets.data(), B, T, false);
}

template class BasicGpt<float>;
template class BasicGpt<double>;

}  // namespace scape::model
