// One interface over the fp32 language models (GPT, Llama), so the training loop holds either:
// the model type of a run config picks the implementation (model/gpt.hpp, model/llama.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "model/gpt.hpp"
#include "model/llama.hpp"

namespace scape::model {

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual const ParamLayout& layout() const = 0;
  virtual void init_params(std::span<float> params, std::uint64_t seed) const = 0;
  // As BasicTransformer (model/transformer.hpp): mean cross-entropy over B*T targets; forward_backward
  // overwrites grads and tells `ready` of each range as the backward pass finishes it.
  virtual double forward_backward(std::span<const float> params, std::span<const std::int32_t> inputs,
                                  std::span<const std::int32_t> targets, int B, int T, std::span<float> grads,
                                  const GradientReady& ready = {}) = 0;
  virtual double loss(std::span<const float> params, std::span<const std::int32_t> inputs,
                      std::span<const std::int32_t> targets, int B, int T) = 0;
};

// The shape of a language model of either type ("gpt" or "llama"; only the matching config is
// read).
struct LanguageModelSpec {
  std::string type = "gpt";
  GptConfig gpt;
  LlamaConfig llama;

  int block_size() const { return type == "llama" ? llama.block_size : gpt.block_size; }
  int vocab_size() const { return type == "llama" ? llama.vocab_size : gpt.vocab_size; }
  // Throws std::invalid_argument naming the field (GptConfig / LlamaConfig validate()).
  void validate() const;
  // The config's parts and sizes (transformer_shape of its family).
  TransformerShape shape() const;
  ParamLayout layout() const;
  // The activation workspace of B sequences of T tokens (workspace_bytes of its shape).
  std::size_t workspace_bytes(std::size_t B, std::size_t T) const;
  std::unique_ptr<LanguageModel> make(kernels::KernelBackend& backend = kernels::cpu_backend()) const;
};

}  // namespace scape::model
