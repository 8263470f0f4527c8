// Llama-style language model (Touvron et al. 2023) with a hand-written backward pass over flat
// parameter and gradient buffers, written against the model ops of
// kernels/model_kernel_list.inc like the GPT (model/gpt.hpp): RMSNorm before attention and MLP
// and at the end, rotary position embeddings (interleaved pairs), a SwiGLU MLP, no biases, an
// untied output matrix, and optional grouped-query attention.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "model/gradient_ready.hpp"
#include "model/precision.hpp"

namespace scape::model {

struct LlamaConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 0;  // key/value heads; 0 means n_head (no grouping)
  int n_embd = 64;
  int block_size = 64;
  int vocab_size = 256;
  Precision precision = Precision::fp32;  // the linear layers' GEMMs (model/precision.hpp)
  int ffn_hidden = 0;  // SwiGLU hidden size; 0 means 8/3 n_embd rounded up to a multiple of 64
  double rope_base = 10000.0;
  double norm_eps = 1e-5;

  int kv_heads() const { return n_kv_head == 0 ? n_head : n_kv_head; }
  int head_dim() const { return n_embd / n_head; }
  int hidden() const;

  // Throws std::invalid_argument naming the offending field: n_embd not divisible by n_head, an
  // odd head dimension (RoPE rotates pairs), n_kv_head not dividing n_head, non-positive sizes.
  void validate() const;
};

// The default SwiGLU hidden size: ceil(8 n_embd / 3) rounded up to a multiple of 64.
int default_ffn_hidden(int n_embd);

// The parameter layout: wte [V, C], per block h.<i>.{attn_norm.w [C], attn.qkv.w [(H + 2 Hkv) hs, C],
// attn.proj.w [C, C], mlp_norm.w [C], mlp.gate_up.w [2 F, C] (gate rows, then up rows),
// mlp.down.w [C, F]}, norm.w [C], lm_head.w [V, C]. Weight decay (the rule of both models,
// docs/configuration.md): every matrix that multiplies activations decays (the block matrices
// and the untied lm_head); embeddings and norm gains do not.
ParamLayout llama_layout(const LlamaConfig& cfg);

// Model FLOPs of one forward+backward per token at sequence length T: 6 per matmul weight
// (block matrices and lm_head) plus causal attention, 6 * n_layer * T * n_embd (as the GPT's).
double train_flops_per_token(const LlamaConfig& cfg, int T);
// Bytes of the float model's activation workspace (activations kept for the backward, once-per-
// pass buffers, token ids) for B sequences of T tokens: what forward_backward allocates on its
// backend for that shape.
std::size_t workspace_bytes(const LlamaConfig& cfg, std::size_t B, std::size_t T);


// Same contract as BasicGpt (model/gpt.hpp): one instance per thread, Real = float on a
// backend or double on the CPU for gradient checks; GPT-2-style init (N(0, 0.02), residual
// projections attn.proj.w and mlp.down.w scaled by 1/sqrt(2 n_layer), norm gains 1).
template <class Real>
class BasicLlama {
 public:
  explicit BasicLlama(const LlamaConfig& cfg, kernels::KernelBackend& backend = kernels::cpu_backend());
  ~BasicLlama();
  BasicLlama(BasicLlama&&) noexcept;
  BasicLlama& operator=(BasicLlama&&) noexcept;
  BasicLlama(const BasicLlama&) = delete;
  BasicLlama& operator=(const BasicLlama&) = delete;

  const LlamaConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  std::size_t num_params() const { return layout_.size(); }

  void init_params(std::span<Real> params, std::uint64_t seed) const;
  Real forward_backward(std::span<const Real> params, std::span<const std::int32_t> inputs,
                        std::span<const std::int32_t> targets, int B, int T, std::span<Real> grads,
                        const GradientReady& ready = {});
  Real loss(std::span<const Real> params, std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
            int B, int T);

 private:
  struct Workspace;
  Real forward(const Real* params, const std::int32_t* inputs, const std::int32_t* targets, int B, int T, bool grad);
  void backward(const Real* params, int B, int T, Real* grads, const GradientReady& ready);
  // The view of tensor `slot` inside a flat parameter or gradient buffer.
  template <class T>
  std::span<T> tensor(T* base, std::size_t slot) const {
    return {base + layout_.slots()[slot].offset, layout_.slots()[slot].numel()};
  }

  LlamaConfig cfg_;
  ParamLayout layout_;
  kernels::KernelBackend* backend_;
  std::unique_ptr<Workspace> ws_;
};

using Llama = BasicLlama<float>;
using LlamaDouble = BasicLlama<double>;

extern template class BasicLlama<float>;
extern template class BasicLlama<double>;

}  // namespace scape::model
