// Llama-style models (Touvron et al. 2023) as a set of transformer parts (model/transformer.hpp):
// RMSNorm before attention and MLP and at the end, rotary position embeddings (interleaved
// pairs), a SwiGLU MLP, no biases, an untied output matrix, and optional grouped-query attention.
#pragma once

#include <cstddef>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "model/precision.hpp"
#include "model/transformer.hpp"

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

// Llama's parts: RMSNorm, rotary positions, a SwiGLU MLP of width hidden(), no biases, an
// untied output matrix lm_head.w. Validates cfg.
TransformerShape llama_shape(const LlamaConfig& cfg);

// The parameter layout (model/transformer.hpp, transformer_layout): wte [V, C], per block
// h.<i>.{attn_norm.w [C], attn.qkv.w [(H + 2 Hkv) hs, C], attn.proj.w [C, C], mlp_norm.w [C],
// mlp.gate_up.w [2 F, C] (gate rows, then up rows), mlp.down.w [C, F]}, norm.w [C],
// lm_head.w [V, C]. The block matrices and lm_head decay; embeddings and norm gains do not.
ParamLayout llama_layout(const LlamaConfig& cfg, std::size_t max_elements = ParamLayout::kMaxIndexed);
double train_flops_per_token(const LlamaConfig& cfg, int T);
std::size_t workspace_bytes(const LlamaConfig& cfg, std::size_t B, std::size_t T);

// The Llama language model (Touvron et al. 2023) on the shared skeleton; the contract of
// BasicTransformer (model/transformer.hpp).
template <class Real>
class BasicLlama : public BasicTransformer<Real> {
 public:
  explicit BasicLlama(const LlamaConfig& cfg, kernels::KernelBackend& backend = kernels::cpu_backend())
      : BasicTransformer<Real>(llama_shape(cfg), backend), cfg_(cfg) {}
  const LlamaConfig& config() const { return cfg_; }

 private:
  LlamaConfig cfg_;
};

using Llama = BasicLlama<float>;
using LlamaDouble = BasicLlama<double>;

}  // namespace scape::model
