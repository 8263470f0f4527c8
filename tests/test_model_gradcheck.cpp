// Gradient checks of the hand-written backward pass (tests/model_gradcheck.hpp): GPT-2, and two
// families that exist only as new sets of parts (model/transformer.hpp) — a Llama with biases
// and a tied head, and a GPT with rotary positions, no biases and an untied head — so that the
// skeleton, not only the two shipped families, is checked. Llama's own check is in
// test_model_llama.cpp.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "model/gpt.hpp"
#include "model/llama.hpp"
#include "model_gradcheck.hpp"

using namespace scape::model;
using scape::testing::check_central_differences;
using scape::testing::compare_float_to_double;
using scape::testing::make_grad_case;

namespace {

// Two blocks (so the residual stream crosses a block boundary), two heads, T < block_size (so the
// unused wpe rows must get exactly zero gradient), a vocab that is not a power of two.
constexpr GptConfig kTiny{.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 13};
constexpr int kB = 2, kT = 6;

scape::testing::GradCase gpt_case(const GptDouble& model) {
  auto c = make_grad_case(model, kB, kT);
  c.targets[3] = c.inputs[3];  // a repeated token exercises the scatter-add into wte
  return c;
}

// A tiny shape with the given parts: 4 query heads sharing 2 key-value heads of width 4.
TransformerShape mixed_shape(const BlockParts& parts, const char* family) {
  TransformerShape s;
  s.family = family;
  s.parts = parts;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.n_embd = 16;
  s.block_size = 6;
  s.vocab_size = 11;
  s.ffn_hidden = 12;
  s.rope_base = 50.0;
  return s;
}

// Llama's parts with biases and a tied head; GPT-2's with RoPE, no biases and an untied head.
constexpr BlockParts with_biases_tied(BlockParts p) {
  p.linear_bias = p.tied_head = true;
  return p;
}
constexpr BlockParts with_rope_untied(BlockParts p) {
  p.position = PositionKind::rotary;
  p.linear_bias = p.tied_head = false;
  return p;
}
const BlockParts kLlamaWithBiases = with_biases_tied(kLlamaParts);
const BlockParts kGptWithRope = with_rope_untied(kGpt2Parts);

std::vector<std::string> names(const scape::ParamLayout& layout) {
  std::vector<std::string> out;
  for (const auto& s : layout.slots()) out.push_back(s.name);
  return out;
}

}  // namespace

TEST_CASE("GPT: double backward matches central differences on every coordinate of every tensor") {
  GptDouble model(kTiny);
  auto c = gpt_case(model);
  const std::vector<double> grads = check_central_differences(model, c);
  // wpe rows t >= T never see a token: their gradient is exactly zero, not merely small.
  const auto& wpe = model.layout().slot("wpe");
  const std::size_t C = static_cast<std::size_t>(kTiny.n_embd);
  for (std::size_t i = wpe.offset + kT * C; i < wpe.end(); ++i) CHECK(grads[i] == 0.0);
}

TEST_CASE("GPT: fp32 model agrees with the double model") {
  GptDouble ref(kTiny);
  Gpt model(kTiny);
  compare_float_to_double(ref, model, gpt_case(ref), 1e-6, 1e-4);
}

TEST_CASE("a new family is a new set of parts: their tensors follow the parts") {
  const auto llama_bias = transformer_layout(mixed_shape(kLlamaWithBiases, "LlamaBias"));
  CHECK(names(llama_bias) == std::vector<std::string>{"wte",
                                                      "h.0.attn_norm.w",
                                                      "h.0.attn.qkv.w",
                                                      "h.0.attn.qkv.bias",
                                                      "h.0.attn.proj.w",
                                                      "h.0.attn.proj.bias",
                                                      "h.0.mlp_norm.w",
                                                      "h.0.mlp.gate_up.w",
                                                      "h.0.mlp.gate_up.bias",
                                                      "h.0.mlp.down.w",
                                                      "h.0.mlp.down.bias",
                                                      "h.1.attn_norm.w",
                                                      "h.1.attn.qkv.w",
                                                      "h.1.attn.qkv.bias",
                                                      "h.1.attn.proj.w",
                                                      "h.1.attn.proj.bias",
                                                      "h.1.mlp_norm.w",
                                                      "h.1.mlp.gate_up.w",
                                                      "h.1.mlp.gate_up.bias",
                                                      "h.1.mlp.down.w",
                                                      "h.1.mlp.down.bias",
                                                      "norm.w"});
  CHECK(llama_bias.slot("h.0.attn.qkv.bias").shape == std::vector<std::size_t>{(4 + 2 * 2) * 4});
  const auto gpt_rope = transformer_layout(mixed_shape(kGptWithRope, "GptRope"));
  CHECK(gpt_rope.slots().front().name == "wte");
  CHECK(gpt_rope.slots()[1].name == "h.0.attn_norm.w");  // no wpe under rotary positions
  CHECK(gpt_rope.slot("h.1.mlp_norm.bias").shape == std::vector<std::size_t>{16});
  CHECK(gpt_rope.slot("h.1.mlp.fc.w").shape == std::vector<std::size_t>{12, 16});
  CHECK(gpt_rope.slots().back().name == "lm_head.w");
  CHECK(gpt_rope.slots().back().decay);
  // Rotary positions need an even head dimension, named with the family.
  TransformerShape odd = mixed_shape(kGptWithRope, "GptRope");
  odd.n_embd = 12;  // head dim 3
  CHECK_THROWS_WITH_AS(transformer_layout(odd), doctest::Contains("GptRope.n_embd = 12: the head dimension"),
                       std::invalid_argument);
}

TEST_CASE("families of parts alone: central differences and fp32 against double") {
  const std::pair<BlockParts, const char*> families[] = {{kLlamaWithBiases, "LlamaBias"}, {kGptWithRope, "GptRope"}};
  for (const auto& [parts, family] : families) {
    CAPTURE(family);
    BasicTransformer<double> model(mixed_shape(parts, family));
    auto c = make_grad_case(model, 2, 5);
    c.inputs[3] = c.inputs[1];  // a repeated token exercises the scatter-add into wte
    check_central_differences(model, c);
    BasicTransformer<float> fp32(mixed_shape(parts, family));
    compare_float_to_double(model, fp32, c, 1e-6, 1e-4);
  }
}
