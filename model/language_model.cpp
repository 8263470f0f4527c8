// LanguageModel over BasicGpt<float> and BasicLlama<float>.
#include "model/language_model.hpp"

#include <stdexcept>

namespace scape::model {
namespace {

template <class Model, class Config>
class Adapter final : public LanguageModel {
 public:
  Adapter(const Config& cfg, kernels::KernelBackend& backend) : model_(cfg, backend) {}
  const ParamLayout& layout() const override { return model_.layout(); }
  void init_params(std::span<float> params, std::uint64_t seed) const override { model_.init_params(params, seed); }
  double forward_backward(std::span<const float> params, std::span<const std::int32_t> inputs,
                          std::span<const std::int32_t> targets, int B, int T, std::span<float> grads,
                          const GradientReady& ready) override {
    return model_.forward_backward(params, inputs, targets, B, T, grads, ready);
  }
  double loss(std::span<const float> params, std::span<const std::int32_t> inputs,
              std::span<const std::int32_t> targets, int B, int T) override {
    return model_.loss(params, inputs, targets, B, T);
  }

 private:
  Model model_;
};

}  // namespace

void LanguageModelSpec::validate() const {
  if (type == "llama") {
    llama.validate();
  } else if (type == "gpt") {
    gpt.validate();
  } else {
    throw std::invalid_argument("model type '" + type + "' is not a language model (gpt, llama)");
  }
}

ParamLayout LanguageModelSpec::layout() const {
  validate();
  return type == "llama" ? llama_layout(llama) : gpt_layout(gpt);
}

std::size_t LanguageModelSpec::workspace_bytes(std::size_t B, std::size_t T) const {
  return type == "llama" ? model::workspace_bytes(llama, B, T) : model::workspace_bytes(gpt, B, T);
}

std::unique_ptr<LanguageModel> LanguageModelSpec::make(kernels::KernelBackend& backend) const {
  validate();
  if (type == "llama") return std::make_unique<Adapter<Llama, LlamaConfig>>(llama, backend);
  return std::make_unique<Adapter<Gpt, GptConfig>>(gpt, backend);
}

}  // namespace scape::model
