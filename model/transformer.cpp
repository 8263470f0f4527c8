// The block skeleton of both language model families, forward and hand-written backward on flat
// buffers, every step a model op of kernels/model_kernel_list.inc run by the model's backend.
// Per block:
//   h = norm(x); qkv = h Wqkv^T (+ b); rope(q, k) under rotary positions; y = attention(qkv);
//   x2 = x + y Wo^T (+ b); m = norm(x2); x3 = x2 + act(m Wup^T (+ b)) Wdown^T (+ b);
// then logits = norm(x_L) Whead^T. With biases the residual is added inside the bias op
// (bias_forward); without, after the product (residual_add), so each family runs exactly the
// ops it always ran. The backward runs the same ops' backwards in reverse; RoPE is applied in
// place, so attention's backward sees the rotated q and k it used and rope_backward maps their
// gradients back to the projection's outputs. Layer order and GPT-2's gradient formulas follow
// karpathy/llm.c train_gpt2.c.
#include "model/transformer.hpp"

#include <string>
#include <vector>

#include "model/activations.hpp"
#include "model/common.hpp"
#include "model/model_ops.hpp"

namespace scape::model {
namespace {

using Z = std::size_t;

// Per-layer activations kept for the backward pass, and buffers used once per pass. A kind the
// parts do not use has size 0 (the layernorm's second statistic under rmsnorm, the product
// buffer kTmp when the bias op adds the residual, kDup when GELU's gradient is taken in place).
enum LayerAct {
  kNorm1,
  kNorm1Stat,
  kNorm1Rstd,
  kQkv,
  kAtt,
  kAttOut,
  kRes2,
  kNorm2,
  kNorm2Stat,
  kNorm2Rstd,
  kUp,
  kAct,
  kRes3,
  kLayerActs
};
enum SingleAct {
  kRes0,
  kNormF,
  kNormFStat,
  kNormFRstd,
  kLogits,
  kRowLoss,
  kTmp,
  kDres,
  kDnorm,
  kDqkv,
  kDattOut,
  kDup,
  kDact,
  kDatt,
  kSingles
};

ActivationSizes activation_sizes(const TransformerShape& s, Z B, Z T) {
  const Z C = s.n_embd, N = B * T, V = s.vocab_size, F = s.ffn_hidden, U = s.mlp_up_width(), S = s.qkv_width();
  const Z att = N * static_cast<Z>(s.n_head) * T;  // B H T T
  const Z rstd = s.parts.norm == NormKind::layernorm ? N : 0;
  std::vector<Z> layer(kLayerActs, N * C), single(kSingles, N * C);
  layer[kNorm1Stat] = layer[kNorm2Stat] = N;
  layer[kNorm1Rstd] = layer[kNorm2Rstd] = rstd;
  layer[kQkv] = N * S;
  layer[kAtt] = att;
  layer[kUp] = N * U;
  layer[kAct] = N * F;
  single[kNormFStat] = single[kRowLoss] = N;
  single[kNormFRstd] = rstd;
  single[kLogits] = N * V;
  single[kTmp] = s.parts.linear_bias ? 0 : N * C;
  single[kDqkv] = N * S;
  single[kDup] = s.parts.mlp == MlpKind::gelu ? 0 : N * U;
  single[kDact] = N * F;
  single[kDatt] = att;
  return {std::move(layer), std::move(single)};
}

// The sizes of one (B, T) call.
struct Dims {
  Dims(const TransformerShape& s, int batch, int seq)
      : B(batch),
        T(seq),
        N(batch * seq),
        C(s.n_embd),
        V(s.vocab_size),
        F(s.ffn_hidden),
        U(s.mlp_up_width()),
        shape{.B = batch, .T = seq, .H = s.n_head, .Hkv = s.n_kv_head, .hs = s.head_dim()},
        S(shape.qkv_width()),
        rotated((shape.H + shape.Hkv) * shape.hs),
        prec(s.precision),
        rope(s.parts.position == PositionKind::rotary) {}
  int B, T, N, C, V, F, U;
  kernels::AttentionShape shape;
  int S;        // columns of the packed q|k|v rows
  int rotated;  // the q and k columns RoPE turns
  Precision prec;
  bool rope;  // rotary positions
};

// The view of tensor `slot` inside a flat parameter or gradient buffer; empty for kNoSlot.
template <class T>
std::span<T> tensor_view(const ParamLayout& layout, T* base, std::size_t slot) {
  if (slot == kNoSlot) return {};
  return {base + layout.slots()[slot].offset, layout.slots()[slot].numel()};
}

template <class R, class Ops>
void norm_forward(Ops& ops, const TransformerShape& s, std::span<R> out, std::span<R> stat, std::span<R> rstd,
                  std::span<const R> in, std::span<const R> w, std::span<const R> b, int N, int C) {
  if (s.parts.norm == NormKind::layernorm) {
    ops.layernorm_forward(out, stat, rstd, in, w, b, N, C, s.norm_eps);
  } else {
    ops.rmsnorm_forward(out, stat, in, w, N, C, s.norm_eps);
  }
}

template <class R, class Ops>
void norm_backward(Ops& ops, const TransformerShape& s, std::span<R> dres, std::span<R> dw, std::span<R> db,
                   std::span<const R> dout, std::span<const R> in, std::span<const R> w, std::span<const R> stat,
                   std::span<const R> rstd, int N, int C) {
  if (s.parts.norm == NormKind::layernorm) {
    ops.layernorm_backward(dres, dw, db, dout, in, w, stat, rstd, N, C);
  } else {
    ops.rmsnorm_backward(dres, dw, dout, in, w, stat, N, C);
  }
}

// out = resid + in W^T (+ bias): in the bias op with a bias, through `tmp` without.
template <class R, class Ops>
void linear_residual(Ops& ops, Precision p, std::span<R> out, std::span<const R> resid, std::span<const R> in,
                     std::span<const R> w, std::span<const R> bias, int N, int IC, int OC, std::span<R> tmp) {
  if (!bias.empty()) {
    linear_forward<R>(ops, p, out, resid, in, w, bias, N, IC, OC);
    return;
  }
  matmul<R>(ops, p, false, true, N, OC, IC, in, w, false, tmp);
  ops.residual_add(resid, tmp, out);
}

template <class R, class Ops>
void activation_forward(Ops& ops, const TransformerShape& s, std::span<R> act, std::span<const R> up, int N) {
  if (s.parts.mlp == MlpKind::gelu) {
    ops.gelu_forward(act, up);
  } else {
    ops.swiglu_forward(act, up, N, s.ffn_hidden);
  }
}

// The gradient at the MLP's first matrix output from the one at the activation's output:
// GELU's in place in dact, SwiGLU's into dup.
template <class R, class Ops>
std::span<R> activation_backward(Ops& ops, const TransformerShape& s, std::span<R> dact, std::span<R> dup,
                                 std::span<const R> up, int N) {
  if (s.parts.mlp == MlpKind::gelu) {
    ops.gelu_backward(dact, up);
    return dact;
  }
  ops.swiglu_backward(dup, dact, up, N, s.ffn_hidden);
  return dup;
}

// Appends a matrix's weight and, with biases, its bias; returns the weight's slot.
std::pair<Z, Z> add_linear(ParamLayout& layout, const std::string& name, Z rows, Z cols, bool bias) {
  const Z w = layout.add(name + ".w", {rows, cols}, true);
  const Z b = bias ? layout.add(name + ".bias", {rows}, false) : kNoSlot;
  return {w, b};
}

std::pair<Z, Z> add_norm(ParamLayout& layout, const std::string& name, Z C, NormKind kind) {
  const Z w = layout.add(name + ".w", {C}, false);
  const Z b = kind == NormKind::layernorm ? layout.add(name + ".bias", {C}, false) : kNoSlot;
  return {w, b};
}

}  // namespace

void TransformerShape::validate(const std::string& prefix) const {
  const auto field = [&](const char* name, int v) { return prefix + "." + name + " = " + std::to_string(v); };
  const std::pair<const char*, int> sizes[] = {
      {"n_layer", n_layer},       {"n_head", n_head},         {"n_kv_head", n_kv_head},  {"n_embd", n_embd},
      {"block_size", block_size}, {"vocab_size", vocab_size}, {"ffn_hidden", ffn_hidden}};
  for (const auto& [name, v] : sizes) {
    require(v >= 1, field(name, v) + ": must be >= 1");
  }
  require(n_embd % n_head == 0, field("n_embd", n_embd) + ": must be a multiple of n_head = " + std::to_string(n_head));
  require(parts.position != PositionKind::rotary || head_dim() % 2 == 0,
          field("n_embd", n_embd) + ": the head dimension n_embd / n_head = " + std::to_string(head_dim()) +
              " must be even (RoPE rotates pairs)");
  require(n_head % n_kv_head == 0, field("n_kv_head", n_kv_head) + ": must divide n_head = " + std::to_string(n_head));
}

std::pair<ParamLayout, TransformerSlots> transformer_tensors(const TransformerShape& s, std::size_t max_elements) {
  s.validate(s.family);
  const Z C = s.n_embd, V = s.vocab_size, F = s.ffn_hidden;
  const bool bias = s.parts.linear_bias;
  const bool gelu = s.parts.mlp == MlpKind::gelu;
  ParamLayout layout(max_elements);
  TransformerSlots t;
  t.wte = layout.add("wte", {V, C}, false);
  if (s.parts.position == PositionKind::learned) t.wpe = layout.add("wpe", {static_cast<Z>(s.block_size), C}, false);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    TransformerBlockSlots b{};
    std::tie(b.norm1_w, b.norm1_b) = add_norm(layout, p + "attn_norm", C, s.parts.norm);
    std::tie(b.qkv_w, b.qkv_b) = add_linear(layout, p + "attn.qkv", static_cast<Z>(s.qkv_width()), C, bias);
    std::tie(b.proj_w, b.proj_b) = add_linear(layout, p + "attn.proj", C, C, bias);
    std::tie(b.norm2_w, b.norm2_b) = add_norm(layout, p + "mlp_norm", C, s.parts.norm);
    std::tie(b.up_w, b.up_b) =
        add_linear(layout, p + (gelu ? "mlp.fc" : "mlp.gate_up"), static_cast<Z>(s.mlp_up_width()), C, bias);
    std::tie(b.down_w, b.down_b) = add_linear(layout, p + (gelu ? "mlp.proj" : "mlp.down"), C, F, bias);
    t.blocks.push_back(b);
  }
  std::tie(t.norm_w, t.norm_b) = add_norm(layout, "norm", C, s.parts.norm);
  t.head = s.parts.tied_head ? t.wte : layout.add("lm_head.w", {V, C}, true);
  return {std::move(layout), std::move(t)};
}

ParamLayout transformer_layout(const TransformerShape& shape, std::size_t max_elements) {
  return transformer_tensors(shape, max_elements).first;
}

double train_flops_per_token(const TransformerShape& s, int T) {
  const double L = s.n_layer, C = s.n_embd, V = s.vocab_size, F = s.ffn_hidden;
  const double matmul_weights = L * (s.qkv_width() * C + C * C + (s.mlp_up_width() + F) * C) + V * C;
  return 6.0 * matmul_weights + 6.0 * L * T * C;
}

std::size_t workspace_bytes(const TransformerShape& shape, std::size_t B, std::size_t T) {
  return activation_sizes(shape, B, T).bytes(shape.n_layer, sizeof(float), B * T);
}

// ---- workspace ------------------------------------------------------------------------------

template <class R>
struct BasicTransformer<R>::Workspace : Activations<R> {
  explicit Workspace(kernels::KernelBackend& backend) : Activations<R>(backend, kLayerActs, kSingles) {}

  void ensure(const TransformerShape& shape, std::size_t B, std::size_t T) {
    L = shape.n_layer;
    auto sizes = activation_sizes(shape, B, T);
    Activations<R>::ensure(L, std::move(sizes.layer), std::move(sizes.single), B * T);
  }

  // The residual stream entering block l.
  std::span<R> block_input(std::ptrdiff_t l) { return l == 0 ? this->single(kRes0) : this->layer(kRes3, l - 1); }

  std::ptrdiff_t L = 0;
};

// ---- BasicTransformer -----------------------------------------------------------------------

template <class R>
BasicTransformer<R>::BasicTransformer(const TransformerShape& shape, kernels::KernelBackend& backend)
    : shape_(shape), backend_(&backend), ws_(std::make_unique<Workspace>(backend)) {
  std::tie(layout_, slots_) = transformer_tensors(shape);
  (void)model_ops<R>(backend);  // throws for a double model on a device
}

template <class R>
BasicTransformer<R>::~BasicTransformer() = default;
template <class R>
BasicTransformer<R>::BasicTransformer(BasicTransformer&&) noexcept = default;
template <class R>
BasicTransformer<R>& BasicTransformer<R>::operator=(BasicTransformer&&) noexcept = default;

template <class R>
void BasicTransformer<R>::init_params(std::span<R> params, std::uint64_t seed) const {
  init_gpt2_style(layout_, params, seed, shape_.n_layer, shape_.family.c_str());
}

template <class R>
void BasicTransformer<R>::check_call(std::span<const R> params, std::span<const std::int32_t> inputs,
                                     std::span<const std::int32_t> targets, int B, int T) const {
  check_batch(shape_.family.c_str(), params.size(), layout_.size(), inputs, targets, B, T, shape_.block_size,
              shape_.vocab_size);
}

template <class R>
R BasicTransformer<R>::forward(const R* p, const std::int32_t* inputs, const std::int32_t* targets, int batch, int seq,
                               bool grad) {
  Workspace& w = *ws_;
  w.ensure(shape_, static_cast<std::size_t>(batch), static_cast<std::size_t>(seq));
  w.set_tokens(inputs, targets);
  auto& ops = model_ops<R>(*backend_);
  const Dims d(shape_, batch, seq);
  const int B = d.B, T = d.T, N = d.N, C = d.C, V = d.V, F = d.F, U = d.U, S = d.S;
  const Precision prec = d.prec;
  auto P = [&](std::size_t slot) { return tensor_view<const R>(layout_, p, slot); };
  const std::span<R> tmp = w.single(kTmp);

  const auto positions = d.rope ? std::span<const R>{} : P(slots_.wpe).first(static_cast<std::size_t>(T) * C);
  ops.embedding_forward(w.single(kRes0), P(slots_.wte), positions, w.inputs(), B, T, C);
  for (std::ptrdiff_t l = 0; l < w.L; ++l) {
    const TransformerBlockSlots& b = slots_.blocks[static_cast<std::size_t>(l)];
    auto a = [&](int act) { return w.layer(act, l); };
    norm_forward<R>(ops, shape_, a(kNorm1), a(kNorm1Stat), a(kNorm1Rstd), w.block_input(l), P(b.norm1_w), P(b.norm1_b),
                    N, C);
    linear_forward<R>(ops, prec, a(kQkv), {}, a(kNorm1), P(b.qkv_w), P(b.qkv_b), N, C, S);
    if (d.rope) ops.rope_forward(a(kQkv), N, T, S, d.rotated, d.shape.hs, shape_.rope_base);
    ops.attention_forward(a(kAttOut), a(kAtt), a(kQkv), d.shape);
    linear_residual<R>(ops, prec, a(kRes2), w.block_input(l), a(kAttOut), P(b.proj_w), P(b.proj_b), N, C, C, tmp);
    norm_forward<R>(ops, shape_, a(kNorm2), a(kNorm2Stat), a(kNorm2Rstd), a(kRes2), P(b.norm2_w), P(b.norm2_b), N, C);
    linear_forward<R>(ops, prec, a(kUp), {}, a(kNorm2), P(b.up_w), P(b.up_b), N, C, U);
    activation_forward<R>(ops, shape_, a(kAct), a(kUp), N);
    linear_residual<R>(ops, prec, a(kRes3), a(kRes2), a(kAct), P(b.down_w), P(b.down_b), N, F, C, tmp);
  }
  norm_forward<R>(ops, shape_, w.single(kNormF), w.single(kNormFStat), w.single(kNormFRstd), w.block_input(w.L),
                  P(slots_.norm_w), P(slots_.norm_b), N, C);
  matmul<R>(ops, prec, false, true, N, V, C, w.single(kNormF), P(slots_.head), false, w.single(kLogits));
  return static_cast<R>(ops.cross_entropy(w.single(kLogits), w.single(kRowLoss), w.targets(), N, V, grad));
}

template <class R>
void BasicTransformer<R>::backward(const R* p, int batch, int seq, R* g, const GradientReady& ready) {
  Workspace& w = *ws_;
  auto& ops = model_ops<R>(*backend_);
  const Dims d(shape_, batch, seq);
  const int B = d.B, T = d.T, N = d.N, C = d.C, V = d.V, F = d.F, U = d.U, S = d.S;
  const Precision prec = d.prec;
  const auto& slots = layout_.slots();
  auto P = [&](std::size_t slot) { return tensor_view<const R>(layout_, p, slot); };
  auto G = [&](std::size_t slot) { return tensor_view<R>(layout_, g, slot); };
  const std::span<R> dres = w.single(kDres), dnorm = w.single(kDnorm), dqkv = w.single(kDqkv),
                     datt_out = w.single(kDattOut), dup = w.single(kDup), dact = w.single(kDact);

  // The logits already hold dloss/dlogits (cross_entropy with the gradient).
  linear_backward<R>(ops, prec, dnorm, G(slots_.head), {}, w.single(kLogits), w.single(kNormF), P(slots_.head), N, C,
                     V);
  backend_->zero_bytes(dres.data(), dres.size_bytes());
  norm_backward<R>(ops, shape_, dres, G(slots_.norm_w), G(slots_.norm_b), dnorm, w.block_input(w.L), P(slots_.norm_w),
                   w.single(kNormFStat), w.single(kNormFRstd), N, C);
  if (ready) ready(slots[slots_.norm_w].offset, layout_.size());  // the final norm (and an untied head)
  for (std::ptrdiff_t l = w.L - 1; l >= 0; --l) {
    const TransformerBlockSlots& b = slots_.blocks[static_cast<std::size_t>(l)];
    auto a = [&](int act) { return w.layer(act, l); };
    linear_backward<R>(ops, prec, dact, G(b.down_w), G(b.down_b), dres, a(kAct), P(b.down_w), N, F, C);
    const std::span<R> d_up = activation_backward<R>(ops, shape_, dact, dup, a(kUp), N);
    linear_backward<R>(ops, prec, dnorm, G(b.up_w), G(b.up_b), d_up, a(kNorm2), P(b.up_w), N, C, U);
    norm_backward<R>(ops, shape_, dres, G(b.norm2_w), G(b.norm2_b), dnorm, a(kRes2), P(b.norm2_w), a(kNorm2Stat),
                     a(kNorm2Rstd), N, C);
    linear_backward<R>(ops, prec, datt_out, G(b.proj_w), G(b.proj_b), dres, a(kAttOut), P(b.proj_w), N, C, C);
    ops.attention_backward(dqkv, w.single(kDatt), datt_out, a(kAtt), a(kQkv), d.shape);
    if (d.rope) ops.rope_backward(dqkv, N, T, S, d.rotated, d.shape.hs, shape_.rope_base);
    linear_backward<R>(ops, prec, dnorm, G(b.qkv_w), G(b.qkv_b), dqkv, a(kNorm1), P(b.qkv_w), N, C, S);
    norm_backward<R>(ops, shape_, dres, G(b.norm1_w), G(b.norm1_b), dnorm, w.block_input(l), P(b.norm1_w),
                     a(kNorm1Stat), a(kNorm1Rstd), N, C);
    const std::size_t next = l + 1 < w.L ? slots_.blocks[static_cast<std::size_t>(l + 1)].norm1_w : slots_.norm_w;
    if (ready) ready(slots[b.norm1_w].offset, slots[next].offset);
  }
  const auto positions = d.rope ? std::span<R>{} : G(slots_.wpe).first(static_cast<std::size_t>(T) * C);
  ops.embedding_backward(G(slots_.wte), positions, dres, w.inputs(), B, T, C);
  // The token embedding (and a tied head) and the position table.
  if (ready) ready(0, slots[slots_.blocks.front().norm1_w].offset);
}

template <class R>
R BasicTransformer<R>::forward_backward(std::span<const R> params, std::span<const std::int32_t> inputs,
                                        std::span<const std::int32_t> targets, int B, int T, std::span<R> grads,
                                        const GradientReady& ready) {
  check_call(params, inputs, targets, B, T);
  require(grads.size() == layout_.size(), shape_.family + "::forward_backward: grads has " +
                                              std::to_string(grads.size()) + " elements, layout needs " +
                                              std::to_string(layout_.size()));
  backend_->zero_bytes(grads.data(), grads.size_bytes());
  const R mean_loss = forward(params.data(), inputs.data(), targets.data(), B, T, true);
  backward(params.data(), B, T, grads.data(), ready);
  return mean_loss;
}

template <class R>
R BasicTransformer<R>::loss(std::span<const R> params, std::span<const std::int32_t> inputs,
                            std::span<const std::int32_t> targets, int B, int T) {
  check_call(params, inputs, targets, B, T);
  return forward(params.data(), inputs.data(), targets.data(), B, T, false);
}

template class BasicTransformer<float>;
template class BasicTransformer<double>;

}  // namespace scape::model
