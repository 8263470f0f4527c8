// GPT-2 as a set of transformer parts (model/transformer.hpp): its config and the shape it
// resolves to.
#pragma once

#include <cstddef>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "model/precision.hpp"
#include "model/transformer.hpp"

namespace scape::model {

struct GptConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 64;
  int block_size = 64;
  int vocab_size = 256;
  Precision precision = Precision::fp32;  // the linear layers' GEMMs (model/precision.hpp)

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

// GPT-2's parts: LayerNorm, a learned position table of block_size rows, a GELU MLP of width
// 4 n_embd, biases on every matrix, the head tied to wte. Validates cfg.
TransformerShape gpt_shape(const GptConfig& cfg);

// The parameter layout (model/transformer.hpp, transformer_layout): wte, wpe, per block
// h.<i>.{attn_norm.w, attn_norm.bias, attn.qkv.w, attn.qkv.bias, attn.proj.w, attn.proj.bias,
// mlp_norm.w, mlp_norm.bias, mlp.fc.w, mlp.fc.bias, mlp.proj.w, mlp.proj.bias}, norm.w,
// norm.bias. Linear weights are [out, in]; only the matrices inside the blocks decay.
ParamLayout gpt_layout(const GptConfig& cfg, std::size_t max_elements = ParamLayout::kMaxIndexed);
double train_flops_per_token(const GptConfig& cfg, int T);
std::size_t workspace_bytes(const GptConfig& cfg, std::size_t B, std::size_t T);

// The GPT-2 language model (Radford et al. 2019) on the shared skeleton; the contract of
// BasicTransformer (model/transformer.hpp).
template <class Real>
class BasicGpt : public BasicTransformer<Real> {
 public:
  explicit BasicGpt(const GptConfig& cfg, kernels::KernelBackend& backend = kernels::cpu_backend())
      : BasicTransformer<Real>(gpt_shape(cfg), backend), cfg_(cfg) {}
  const GptConfig& config() const { return cfg_; }

 private:
  GptConfig cfg_;
};

using Gpt = BasicGpt<float>;
using GptDouble = BasicGpt<double>;

}  // namespace scape::model
