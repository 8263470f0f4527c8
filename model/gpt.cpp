// GPT-2 forward and hand-written backward on flat buffers, every step a model op of
// kernels/model_kernel_list.inc run by the model's backend (layer order and gradient formulas
// follow karpathy/llm.c train_gpt2.c).
#include "model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.hpp"
#include "model/activations.hpp"
#include "model/common.hpp"
#include "model/model_ops.hpp"

namespace scape::model {

namespace {

using Index = std::ptrdiff_t;

constexpr double kLayerNormEps = 1e-5;

// Slot order inside one block; gpt_layout() adds them in exactly this order.
enum BlockSlot : std::size_t {
  kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kMprojW, kMprojB, kBlockSlots
};
constexpr std::size_t kWte = 0;
constexpr std::size_t kWpe = 1;
constexpr std::size_t kFirstBlock = 2;

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
    layout.add(p + "attn_norm.w", {C}, false);
    layout.add(p + "attn_norm.bias", {C}, false);
    layout.add(p + "attn.qkv.w", {3 * C, C}, true);
    layout.add(p + "attn.qkv.bias", {3 * C}, false);
    layout.add(p + "attn.proj.w", {C, C}, true);
    layout.add(p + "attn.proj.bias", {C}, false);
    layout.add(p + "mlp_norm.w", {C}, false);
    layout.add(p + "mlp_norm.bias", {C}, false);
    layout.add(p + "mlp.fc.w", {4 * C, C}, true);
    layout.add(p + "mlp.fc.bias", {4 * C}, false);
    layout.add(p + "mlp.proj.w", {C, 4 * C}, true);
    layout.add(p + "mlp.proj.bias", {C}, false);
  }
  layout.add("norm.w", {C}, false);
  layout.add("norm.bias", {C}, false);
  return layout;
}

double train_flops_per_token(const GptConfig& cfg, int T) {
  const double L = cfg.n_layer, C = cfg.n_embd, V = cfg.vocab_size;
  const double matmul_weights = 12.0 * L * C * C + V * C;
  return 6.0 * matmul_weights + 6.0 * L * T * C;
}

// ---- workspace ------------------------------------------------------------------------------

namespace {
// Per-layer activations kept for the backward pass, and buffers used once per pass.
enum GptLayerAct { kLn1, kLn1Mean, kLn1Rstd, kQkv, kAtt, kAtty, kRes2, kLn2, kLn2Mean, kLn2Rstd, kFch, kFcg, kRes3, kLayerActs };
enum GptSingle { kRes0, kLnf, kLnfMean, kLnfRstd, kLogits, kRowLoss, kDres, kDln, kDqkv, kDatty, kDfc, kDatt, kSingles };

ActivationSizes gpt_activation_sizes(const GptConfig& cfg, std::size_t B, std::size_t T) {
  const std::size_t C = cfg.n_embd, H = cfg.n_head, N = B * T, V = cfg.vocab_size;
  std::vector<std::size_t> layer(kLayerActs, N * C), single(kSingles, N * C);
  for (int k : {kLn1Mean, kLn1Rstd, kLn2Mean, kLn2Rstd}) layer[k] = N;
  layer[kQkv] = N * 3 * C;
  layer[kAtt] = N * H * T;  // B H T T
  layer[kFch] = layer[kFcg] = N * 4 * C;
  for (int k : {kLnfMean, kLnfRstd, kRowLoss}) single[k] = N;
  single[kLogits] = N * V;
  single[kDqkv] = N * 3 * C;
  single[kDfc] = N * 4 * C;
  single[kDatt] = N * H * T;
  return {std::move(layer), std::move(single)};
}

}  // namespace

std::size_t workspace_bytes(const GptConfig& cfg, std::size_t B, std::size_t T) {
  return gpt_activation_sizes(cfg, B, T).bytes(cfg.n_layer, sizeof(float), B * T);
}

template <class R>
struct BasicGpt<R>::Workspace : Activations<R> {
  explicit Workspace(kernels::KernelBackend& backend) : Activations<R>(backend, kLayerActs, kSingles) {}

  void ensure(const GptConfig& cfg, std::size_t B, std::size_t T) {
    L = cfg.n_layer;
    auto sizes = gpt_activation_sizes(cfg, B, T);
    Activations<R>::ensure(L, std::move(sizes.layer), std::move(sizes.single), B * T);
  }

  // The residual stream entering block l.
  std::span<R> block_input(std::ptrdiff_t l) { return l == 0 ? this->single(kRes0) : this->layer(kRes3, l - 1); }

  std::ptrdiff_t L = 0;
};

// ---- BasicGpt -------------------------------------------------------------------------------

template <class R>
BasicGpt<R>::BasicGpt(const GptConfig& cfg, kernels::KernelBackend& backend)
    : cfg_(cfg), layout_(gpt_layout(cfg)), backend_(&backend), ws_(std::make_unique<Workspace>(backend)) {
  (void)model_ops<R>(backend);  // throws for a double model on a device
}

template <class R>
BasicGpt<R>::~BasicGpt() = default;
template <class R>
BasicGpt<R>::BasicGpt(BasicGpt&&) noexcept = default;
template <class R>
BasicGpt<R>& BasicGpt<R>::operator=(BasicGpt&&) noexcept = default;

template <class R>
void BasicGpt<R>::init_params(std::span<R> params, std::uint64_t seed) const {
  init_gpt2_style(layout_, params, seed, cfg_.n_layer, "Gpt");
}

template <class R>
void BasicGpt<R>::check_call(std::span<const R> params, std::span<const std::int32_t> inputs,
                             std::span<const std::int32_t> targets, int B, int T) const {
  check_batch("Gpt", params.size(), layout_.size(), inputs, targets, B, T, cfg_.block_size, cfg_.vocab_size);
}

template <class R>
R BasicGpt<R>::forward(const R* p, const std::int32_t* inputs, const std::int32_t* targets, int batch, int seq,
                       bool grad) {
  Workspace& w = *ws_;
  w.ensure(cfg_, static_cast<std::size_t>(batch), static_cast<std::size_t>(seq));
  w.set_tokens(inputs, targets);
  auto& ops = model_ops<R>(*backend_);
  const int B = batch, T = seq, N = B * T, C = cfg_.n_embd, V = cfg_.vocab_size;
  const auto& slots = layout_.slots();
  auto P = [&](std::size_t slot) { return std::span<const R>(p + slots[slot].offset, slots[slot].numel()); };
  const kernels::AttentionShape shape{.B = B, .T = T, .H = cfg_.n_head, .Hkv = cfg_.n_head, .hs = C / cfg_.n_head};

  ops.embedding_forward(w.single(kRes0), P(kWte), P(kWpe).first(static_cast<std::size_t>(T) * C), w.inputs(), B, T, C);
  for (Index l = 0; l < w.L; ++l) {
    const std::size_t s = kFirstBlock + static_cast<std::size_t>(l) * kBlockSlots;
    auto a = [&](int act) { return w.layer(act, l); };
    ops.layernorm_forward(a(kLn1), a(kLn1Mean), a(kLn1Rstd), w.block_input(l), P(s + kLn1W), P(s + kLn1B), N,
                          C, kLayerNormEps);
    linear_forward<R>(ops, cfg_.precision, a(kQkv), {}, a(kLn1), P(s + kQkvW), P(s + kQkvB), N, C, 3 * C);
    ops.attention_forward(a(kAtty), a(kAtt), a(kQkv), shape);
    linear_forward<R>(ops, cfg_.precision, a(kRes2), w.block_input(l), a(kAtty), P(s + kProjW), P(s + kProjB), N,
                                     C, C);
    ops.layernorm_forward(a(kLn2), a(kLn2Mean), a(kLn2Rstd), a(kRes2), P(s + kLn2W), P(s + kLn2B), N, C,
                          kLayerNormEps);
    linear_forward<R>(ops, cfg_.precision, a(kFch), {}, a(kLn2), P(s + kFcW), P(s + kFcB), N, C, 4 * C);
    ops.gelu_forward(a(kFcg), a(kFch));
    linear_forward<R>(ops, cfg_.precision, a(kRes3), a(kRes2), a(kFcg), P(s + kMprojW), P(s + kMprojB), N,
                                     4 * C, C);
  }
  const std::size_t f = kFirstBlock + static_cast<std::size_t>(w.L) * kBlockSlots;
  ops.layernorm_forward(w.single(kLnf), w.single(kLnfMean), w.single(kLnfRstd), w.block_input(w.L), P(f), P(f + 1), N,
                        C, kLayerNormEps);
  // Tied head: logits = lnf wte^T.
  matmul<R>(ops, cfg_.precision, false, true, N, V, C, w.single(kLnf), P(kWte), false, w.single(kLogits));
  return static_cast<R>(ops.cross_entropy(w.single(kLogits), w.single(kRowLoss), w.targets(), N, V, grad));
}

template <class R>
void BasicGpt<R>::backward(const R* p, int batch, int seq, R* g, const GradientReady& ready) {
  Workspace& w = *ws_;
  auto& ops = model_ops<R>(*backend_);
  const int B = batch, T = seq, N = B * T, C = cfg_.n_embd, V = cfg_.vocab_size;
  const auto& slots = layout_.slots();
  auto P = [&](std::size_t slot) { return std::span<const R>(p + slots[slot].offset, slots[slot].numel()); };
  auto G = [&](std::size_t slot) { return std::span<R>(g + slots[slot].offset, slots[slot].numel()); };
  const kernels::AttentionShape shape{.B = B, .T = T, .H = cfg_.n_head, .Hkv = cfg_.n_head, .hs = C / cfg_.n_head};
  const std::span<R> dres = w.single(kDres), dln = w.single(kDln), dfc = w.single(kDfc), datty = w.single(kDatty),
                     dqkv = w.single(kDqkv);

  // The logits already hold dloss/dlogits (cross_entropy with the gradient).
  linear_backward<R>(ops, cfg_.precision, dln, G(kWte), {}, w.single(kLogits), w.single(kLnf), P(kWte), N, C, V);
  const std::size_t f = kFirstBlock + static_cast<std::size_t>(w.L) * kBlockSlots;
  backend_->zero_bytes(dres.data(), dres.size_bytes());
  ops.layernorm_backward(dres, G(f), G(f + 1), dln, w.block_input(w.L), P(f), w.single(kLnfMean), w.single(kLnfRstd),
                         N, C);
  if (ready) ready(slots[f].offset, layout_.size());  // the final LayerNorm
  for (Index l = w.L - 1; l >= 0; --l) {
    const std::size_t s = kFirstBlock + static_cast<std::size_t>(l) * kBlockSlots;
    auto a = [&](int act) { return w.layer(act, l); };
    linear_backward<R>(ops, cfg_.precision, dfc, G(s + kMprojW), G(s + kMprojB), dres, a(kFcg), P(s + kMprojW), N,
                                      4 * C, C);
    ops.gelu_backward(dfc, a(kFch));
    linear_backward<R>(ops, cfg_.precision, dln, G(s + kFcW), G(s + kFcB), dfc, a(kLn2), P(s + kFcW), N, C, 4 * C);
    ops.layernorm_backward(dres, G(s + kLn2W), G(s + kLn2B), dln, a(kRes2), P(s + kLn2W), a(kLn2Mean),
                           a(kLn2Rstd), N, C);
    linear_backward<R>(ops, cfg_.precision, datty, G(s + kProjW), G(s + kProjB), dres, a(kAtty), P(s + kProjW), N, C,
                                      C);
    ops.attention_backward(dqkv, w.single(kDatt), datty, a(kAtt), a(kQkv), shape);
    linear_backward<R>(ops, cfg_.precision, dln, G(s + kQkvW), G(s + kQkvB), dqkv, a(kLn1), P(s + kQkvW), N, C,
                                      3 * C);
    ops.layernorm_backward(dres, G(s + kLn1W), G(s + kLn1B), dln, w.block_input(l), P(s + kLn1W), a(kLn1Mean),
                           a(kLn1Rstd), N, C);
    if (ready) ready(slots[s].offset, slots[s + kBlockSlots].offset);
  }
  ops.embedding_backward(G(kWte), G(kWpe).first(static_cast<std::size_t>(T) * C), dres,
                         w.inputs(), B, T, C);
  if (ready) ready(0, slots[kFirstBlock].offset);  // the token (and tied head) and position embeddings
}

template <class R>
R BasicGpt<R>::forward_backward(std::span<const R> params, std::span<const std::int32_t> inputs,
                                std::span<const std::int32_t> targets, int B, int T, std::span<R> grads,
                                const GradientReady& ready) {
  check_call(params, inputs, targets, B, T);
  require(grads.size() == layout_.size(), "Gpt::forward_backward: grads has " + std::to_string(grads.size()) +
                                              " elements, layout needs " + std::to_string(layout_.size()));
  backend_->zero_bytes(grads.data(), grads.size_bytes());
  const R mean_loss = forward(params.data(), inputs.data(), targets.data(), B, T, true);
  backward(params.data(), B, T, grads.data(), ready);
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
