// GPT-2's parts and config (model/gpt.hpp); the forward and backward passes are the shared
// skeleton's (model/transformer.cpp).
#include "model/gpt.hpp"

namespace scape::model {
namespace {

TransformerShape unchecked_shape(const GptConfig& cfg) {
  TransformerShape s;
  s.family = "Gpt";
  s.parts = BlockParts{.norm = NormKind::layernorm, .position = PositionKind::learned, .mlp = MlpKind::gelu,
                       .linear_bias = true, .tied_head = true};
  s.n_layer = cfg.n_layer;
  s.n_head = cfg.n_head;
  s.n_kv_head = cfg.n_head;
  s.n_embd = cfg.n_embd;
  s.block_size = cfg.block_size;
  s.vocab_size = cfg.vocab_size;
  s.ffn_hidden = 4 * cfg.n_embd;
  s.precision = cfg.precision;
  s.norm_eps = 1e-5;
  return s;
}

}  // namespace

void GptConfig::validate() const { unchecked_shape(*this).validate("GptConfig"); }

TransformerShape gpt_shape(const GptConfig& cfg) {
  cfg.validate();
  return unchecked_shape(cfg);
}

ParamLayout gpt_layout(const GptConfig& cfg, std::size_t max_elements) {
  return transformer_layout(gpt_shape(cfg), max_elements);
}

double train_flops_per_token(const GptConfig& cfg, int T) { return train_flops_per_token(gpt_shape(cfg), T); }

std::size_t workspace_bytes(const GptConfig& cfg, std::size_t B, std::size_t T) {
  return workspace_bytes(gpt_shape(cfg), B, T);
}

}  // namespace scape::model
