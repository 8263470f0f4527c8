// Llama's parts and config (model/llama.hpp); the forward and backward passes are the shared
// skeleton's (model/transformer.cpp).
#include "model/llama.hpp"

#include <string>

#include "model/common.hpp"

namespace scape::model {
namespace {

TransformerShape unchecked_shape(const LlamaConfig& cfg) {
  TransformerShape s = shape_with_common_sizes("Llama", kLlamaParts, cfg);
  s.n_kv_head = cfg.kv_heads();
  s.ffn_hidden = cfg.hidden();
  s.rope_base = cfg.rope_base;
  s.norm_eps = cfg.norm_eps;
  return s;
}

}  // namespace

int default_ffn_hidden(int n_embd) {
  const int third = (8 * n_embd + 2) / 3;  // ceil(8 C / 3)
  return (third + 63) / 64 * 64;
}

int LlamaConfig::hidden() const { return ffn_hidden == 0 ? default_ffn_hidden(n_embd) : ffn_hidden; }

void LlamaConfig::validate() const {
  require(n_kv_head >= 0, "LlamaConfig.n_kv_head = " + std::to_string(n_kv_head) + ": must be >= 0 (0: n_head)");
  require(ffn_hidden >= 0, "LlamaConfig.ffn_hidden = " + std::to_string(ffn_hidden) + ": must be >= 0 (0: default)");
  require(rope_base > 1.0, "LlamaConfig.rope_base = " + std::to_string(rope_base) + ": must be > 1");
  require(norm_eps > 0.0, "LlamaConfig.norm_eps = " + std::to_string(norm_eps) + ": must be > 0");
  unchecked_shape(*this).validate("LlamaConfig");
}

TransformerShape transformer_shape(const LlamaConfig& cfg) {
  cfg.validate();
  return unchecked_shape(cfg);
}

}  // namespace scape::model
