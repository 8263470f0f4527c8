// Llama forward and hand-written backward on flat buffers, every step a model op of
// kernels/model_kernel_list.inc run by the model's backend. Per block:
//   h = rmsnorm(x); qkv = h Wqkv^T; rope(q, k); y = attention(qkv); x2 = x + y Wo^T;
//   m = rmsnorm(x2); x3 = x2 + swiglu(m Wgu^T) Wdown^T;
// then logits = rmsnorm(x_L) Wlm^T. The backward runs the same ops' backwards in reverse; RoPE
// is applied in place, so attention's backward sees the rotated q and k it used and rope_backward
// maps their gradients back to the projection's outputs.
#include "model/llama.hpp"

#include <string>
#include <vector>

#include "model/activations.hpp"
#include "model/common.hpp"
#include "model/model_ops.hpp"

namespace scape::model {

namespace {

// Slot order inside one block; llama_layout() adds them in exactly this order.
enum BlockSlot : std::size_t { kAttnNorm, kQkvW, kProjW, kMlpNorm, kGateUpW, kDownW, kBlockSlots };
constexpr std::size_t kWte = 0;
constexpr std::size_t kFirstBlock = 1;

// The sizes of one (B, T) call.
struct Dims {
  Dims(const LlamaConfig& cfg, int batch, int seq)
      : B(batch), T(seq), N(batch * seq), C(cfg.n_embd), V(cfg.vocab_size), F(cfg.hidden()),
        shape{.B = batch, .T = seq, .H = cfg.n_head, .Hkv = cfg.kv_heads(), .hs = cfg.head_dim()},
        S(shape.qkv_width()), rotated((shape.H + shape.Hkv) * shape.hs) {}
  int B, T, N, C, V, F;
  kernels::AttentionShape shape;
  int S;        // columns of the packed q|k|v rows
  int rotated;  // the q and k columns RoPE turns
};

enum LlamaLayerAct { kH, kRrms1, kQkv, kAtt, kY, kRes2, kM, kRrms2, kGu, kS, kRes3, kLayerActs };
enum LlamaSingle { kRes0, kNormOut, kNormRrms, kLogits, kRowLoss, kTmp, kDres, kDn, kDqkv, kDy, kDgu, kDs, kDatt, kSingles };

}  // namespace

int default_ffn_hidden(int n_embd) {
  const int third = (8 * n_embd + 2) / 3;  // ceil(8 C / 3)
  return (third + 63) / 64 * 64;
}

int LlamaConfig::hidden() const { return ffn_hidden == 0 ? default_ffn_hidden(n_embd) : ffn_hidden; }

void LlamaConfig::validate() const {
  auto positive = [](int v, const char* field) {
    require(v >= 1, std::string("LlamaConfig.") + field + " = " + std::to_string(v) + ": must be >= 1");
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  positive(block_size, "block_size");
  positive(vocab_size, "vocab_size");
  require(n_kv_head >= 0, "LlamaConfig.n_kv_head = " + std::to_string(n_kv_head) + ": must be >= 0 (0: n_head)");
  require(ffn_hidden >= 0, "LlamaConfig.ffn_hidden = " + std::to_string(ffn_hidden) + ": must be >= 0 (0: default)");
  require(n_embd % n_head == 0, "LlamaConfig.n_embd = " + std::to_string(n_embd) +
                                    ": must be a multiple of n_head = " + std::to_string(n_head));
  require(head_dim() % 2 == 0, "LlamaConfig.n_embd = " + std::to_string(n_embd) + ": the head dimension n_embd / n_head = " +
                                   std::to_string(head_dim()) + " must be even (RoPE rotates pairs)");
  require(n_head % kv_heads() == 0, "LlamaConfig.n_kv_head = " + std::to_string(n_kv_head) +
                                        ": must divide n_head = " + std::to_string(n_head));
  require(rope_base > 1.0, "LlamaConfig.rope_base = " + std::to_string(rope_base) + ": must be > 1");
  require(norm_eps > 0.0, "LlamaConfig.norm_eps = " + std::to_string(norm_eps) + ": must be > 0");
}

ParamLayout llama_layout(const LlamaConfig& cfg) {
  cfg.validate();
  const auto C = static_cast<std::size_t>(cfg.n_embd);
  const auto V = static_cast<std::size_t>(cfg.vocab_size);
  const auto F = static_cast<std::size_t>(cfg.hidden());
  const auto S = static_cast<std::size_t>((cfg.n_head + 2 * cfg.kv_heads()) * cfg.head_dim());
  ParamLayout layout;
  layout.add("wte", {V, C}, false);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    layout.add(p + "attn_norm.w", {C}, false);
    layout.add(p + "attn.qkv.w", {S, C}, true);
    layout.add(p + "attn.proj.w", {C, C}, true);
    layout.add(p + "mlp_norm.w", {C}, false);
    layout.add(p + "mlp.gate_up.w", {2 * F, C}, true);
    layout.add(p + "mlp.down.w", {C, F}, true);
  }
  layout.add("norm.w", {C}, false);
  layout.add("lm_head.w", {V, C}, true);
  return layout;
}

double train_flops_per_token(const LlamaConfig& cfg, int T) {
  const double L = cfg.n_layer, C = cfg.n_embd, V = cfg.vocab_size, F = cfg.hidden();
  const double S = static_cast<double>(cfg.n_head + 2 * cfg.kv_heads()) * cfg.head_dim();
  const double matmul_weights = L * (S * C + C * C + 3 * F * C) + V * C;
  return 6.0 * matmul_weights + 6.0 * L * T * C;
}

// ---- workspace ------------------------------------------------------------------------------

namespace {

ActivationSizes llama_activation_sizes(const LlamaConfig& cfg, std::size_t B, std::size_t T) {
  const std::size_t C = cfg.n_embd, N = B * T, V = cfg.vocab_size, F = cfg.hidden();
  const std::size_t S = static_cast<std::size_t>(cfg.n_head + 2 * cfg.kv_heads()) * cfg.head_dim();
  const std::size_t att = N * static_cast<std::size_t>(cfg.n_head) * T;  // B H T T
  std::vector<std::size_t> layer(kLayerActs, N * C), single(kSingles, N * C);
  layer[kRrms1] = layer[kRrms2] = N;
  layer[kQkv] = N * S;
  layer[kAtt] = att;
  layer[kGu] = N * 2 * F;
  layer[kS] = N * F;
  single[kNormRrms] = single[kRowLoss] = N;
  single[kLogits] = N * V;
  single[kDqkv] = N * S;
  single[kDgu] = N * 2 * F;
  single[kDs] = N * F;
  single[kDatt] = att;
  return {std::move(layer), std::move(single)};
}

}  // namespace

std::size_t workspace_bytes(const LlamaConfig& cfg, std::size_t B, std::size_t T) {
  return llama_activation_sizes(cfg, B, T).bytes(cfg.n_layer, sizeof(float), B * T);
}

template <class R>
struct BasicLlama<R>::Workspace : Activations<R> {
  explicit Workspace(kernels::KernelBackend& backend) : Activations<R>(backend, kLayerActs, kSingles) {}

  void ensure(const LlamaConfig& cfg, std::size_t B, std::size_t T) {
    L = cfg.n_layer;
    auto sizes = llama_activation_sizes(cfg, B, T);
    Activations<R>::ensure(L, std::move(sizes.layer), std::move(sizes.single), B * T);
  }

  // The residual stream entering block l.
  std::span<R> block_input(std::ptrdiff_t l) { return l == 0 ? this->single(kRes0) : this->layer(kRes3, l - 1); }

  std::ptrdiff_t L = 0;
};

// ---- BasicLlama -----------------------------------------------------------------------------

template <class R>
BasicLlama<R>::BasicLlama(const LlamaConfig& cfg, kernels::KernelBackend& backend)
    : cfg_(cfg), layout_(llama_layout(cfg)), backend_(&backend), ws_(std::make_unique<Workspace>(backend)) {
  (void)model_ops<R>(backend);  // throws for a double model on a device
}

template <class R>
BasicLlama<R>::~BasicLlama() = default;
template <class R>
BasicLlama<R>::BasicLlama(BasicLlama&&) noexcept = default;
template <class R>
BasicLlama<R>& BasicLlama<R>::operator=(BasicLlama&&) noexcept = default;

template <class R>
void BasicLlama<R>::init_params(std::span<R> params, std::uint64_t seed) const {
  init_gpt2_style(layout_, params, seed, cfg_.n_layer, "Llama");
}

template <class R>
R BasicLlama<R>::forward(const R* p, const std::int32_t* inputs, const std::int32_t* targets, int batch, int seq,
                         bool grad) {
  Workspace& w = *ws_;
  w.ensure(cfg_, static_cast<std::size_t>(batch), static_cast<std::size_t>(seq));
  w.set_tokens(inputs, targets);
  auto& ops = model_ops<R>(*backend_);
  const Dims d(cfg_, batch, seq);
  const int B = d.B, T = d.T, N = d.N, C = d.C, V = d.V, F = d.F, S = d.S, rotated = d.rotated;
  const kernels::AttentionShape& shape = d.shape;
  auto P = [&](std::size_t slot) { return tensor<const R>(p, slot); };
  const std::span<R> tmp = w.single(kTmp);

  ops.embedding_forward(w.single(kRes0), P(kWte), {}, w.inputs(), B, T, C);
  for (std::ptrdiff_t l = 0; l < w.L; ++l) {
    const std::size_t s = kFirstBlock + static_cast<std::size_t>(l) * kBlockSlots;
    auto a = [&](int act) { return w.layer(act, l); };
    ops.rmsnorm_forward(a(kH), a(kRrms1), w.block_input(l), P(s + kAttnNorm), N, C, cfg_.norm_eps);
    matmul<R>(ops, cfg_.precision, false, true, N, S, C, a(kH), P(s + kQkvW), false, a(kQkv));
    ops.rope_forward(a(kQkv), N, T, S, rotated, shape.hs, cfg_.rope_base);
    ops.attention_forward(a(kY), a(kAtt), a(kQkv), shape);
    matmul<R>(ops, cfg_.precision, false, true, N, C, C, a(kY), P(s + kProjW), false, tmp);
    ops.residual_add(w.block_input(l), tmp, a(kRes2));
    ops.rmsnorm_forward(a(kM), a(kRrms2), a(kRes2), P(s + kMlpNorm), N, C, cfg_.norm_eps);
    matmul<R>(ops, cfg_.precision, false, true, N, 2 * F, C, a(kM), P(s + kGateUpW), false, a(kGu));
    ops.swiglu_forward(a(kS), a(kGu), N, F);
    matmul<R>(ops, cfg_.precision, false, true, N, C, F, a(kS), P(s + kDownW), false, tmp);
    ops.residual_add(a(kRes2), tmp, a(kRes3));
  }
  const std::size_t f = kFirstBlock + static_cast<std::size_t>(w.L) * kBlockSlots;
  ops.rmsnorm_forward(w.single(kNormOut), w.single(kNormRrms), w.block_input(w.L), P(f), N, C, cfg_.norm_eps);
  matmul<R>(ops, cfg_.precision, false, true, N, V, C, w.single(kNormOut), P(f + 1), false, w.single(kLogits));
  return static_cast<R>(ops.cross_entropy(w.single(kLogits), w.single(kRowLoss), w.targets(), N, V, grad));
}

template <class R>
void BasicLlama<R>::backward(const R* p, int batch, int seq, R* g, const GradientReady& ready) {
  Workspace& w = *ws_;
  auto& ops = model_ops<R>(*backend_);
  const Dims d(cfg_, batch, seq);
  const int B = d.B, T = d.T, N = d.N, C = d.C, V = d.V, F = d.F, S = d.S, rotated = d.rotated;
  const kernels::AttentionShape& shape = d.shape;
  auto P = [&](std::size_t slot) { return tensor<const R>(p, slot); };
  auto G = [&](std::size_t slot) { return tensor<R>(g, slot); };
  const std::span<R> dres = w.single(kDres), dn = w.single(kDn), dqkv = w.single(kDqkv), dy = w.single(kDy),
                     dgu = w.single(kDgu), ds = w.single(kDs);

  // The logits already hold dloss/dlogits (cross_entropy with the gradient).
  const std::size_t f = kFirstBlock + static_cast<std::size_t>(w.L) * kBlockSlots;
  linear_backward<R>(ops, cfg_.precision, dn, G(f + 1), {}, w.single(kLogits), w.single(kNormOut), P(f + 1), N, C, V);
  backend_->zero_bytes(dres.data(), dres.size_bytes());
  ops.rmsnorm_backward(dres, G(f), dn, w.block_input(w.L), P(f), w.single(kNormRrms), N, C);
  const auto& slots = layout_.slots();
  if (ready) ready(slots[f].offset, layout_.size());  // the final norm and the head
  for (std::ptrdiff_t l = w.L - 1; l >= 0; --l) {
    const std::size_t s = kFirstBlock + static_cast<std::size_t>(l) * kBlockSlots;
    auto a = [&](int act) { return w.layer(act, l); };
    linear_backward<R>(ops, cfg_.precision, ds, G(s + kDownW), {}, dres, a(kS), P(s + kDownW), N, F, C);
    ops.swiglu_backward(dgu, ds, a(kGu), N, F);
    linear_backward<R>(ops, cfg_.precision, dn, G(s + kGateUpW), {}, dgu, a(kM), P(s + kGateUpW), N, C, 2 * F);
    ops.rmsnorm_backward(dres, G(s + kMlpNorm), dn, a(kRes2), P(s + kMlpNorm), a(kRrms2), N, C);
    linear_backward<R>(ops, cfg_.precision, dy, G(s + kProjW), {}, dres, a(kY), P(s + kProjW), N, C, C);
    ops.attention_backward(dqkv, w.single(kDatt), dy, a(kAtt), a(kQkv), shape);
    ops.rope_backward(dqkv, N, T, S, rotated, shape.hs, cfg_.rope_base);
    linear_backward<R>(ops, cfg_.precision, dn, G(s + kQkvW), {}, dqkv, a(kH), P(s + kQkvW), N, C, S);
    ops.rmsnorm_backward(dres, G(s + kAttnNorm), dn, w.block_input(l), P(s + kAttnNorm), a(kRrms1), N, C);
    if (ready) ready(slots[s].offset, slots[s + kBlockSlots].offset);
  }
  ops.embedding_backward(G(kWte), {}, dres, w.inputs(), B, T, C);
  if (ready) ready(0, slots[kFirstBlock].offset);
}

template <class R>
R BasicLlama<R>::forward_backward(std::span<const R> params, std::span<const std::int32_t> inputs,
                                  std::span<const std::int32_t> targets, int B, int T, std::span<R> grads,
                                  const GradientReady& ready) {
  check_batch("Llama", params.size(), layout_.size(), inputs, targets, B, T, cfg_.block_size, cfg_.vocab_size);
  require(grads.size() == layout_.size(), "Llama::forward_backward: grads has " + std::to_string(grads.size()) +
                                              " elements, layout needs " + std::to_string(layout_.size()));
  backend_->zero_bytes(grads.data(), grads.size_bytes());
  const R mean_loss = forward(params.data(), inputs.data(), targets.data(), B, T, true);
  backward(params.data(), B, T, grads.data(), ready);
  return mean_loss;
}

template <class R>
R BasicLlama<R>::loss(std::span<const R> params, std::span<const std::int32_t> inputs,
                      std::span<const std::int32_t> targets, int B, int T) {
  check_batch("Llama", params.size(), layout_.size(), inputs, targets, B, T, cfg_.block_size, cfg_.vocab_size);
  return forward(params.data(), inputs.data(), targets.data(), B, T, false);
}

template class BasicLlama<float>;
template class BasicLlama<double>;

}  // namespace scape::model
