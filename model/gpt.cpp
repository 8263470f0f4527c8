// GPT-2's parts and config (model/gpt.hpp); the forward and backward passes are the shared
// skeleton's (model/transformer.cpp).
#include "model/gpt.hpp"

namespace scape::model {
namespace {

TransformerShape unchecked_shape(const GptConfig& cfg) {
  TransformerShape s = shape_with_common_sizes("Gpt", kGpt2Parts, cfg);
  s.ffn_hidden = 4 * cfg.n_embd;  // LayerNorm's eps is the shape's default, 1e-5
  return s;
}

}  // namespace

void GptConfig::validate() const { unchecked_shape(*this).validate("GptConfig"); }

TransformerShape transformer_shape(const GptConfig& cfg) {
  cfg.validate();
  return unchecked_shape(cfg);
}

}  // namespace scape::model
