// LanguageModel over the float transformer of either family.
#include "model/language_model.hpp"

#include <stdexcept>

namespace scape::model {
namespace {

class Adapter final : public LanguageModel {
 public:
  Adapter(const TransformerShape& shape, kernels::KernelBackend& backend) : model_(shape, backend) {}
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
  BasicTransformer<float> model_;
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

TransformerShape LanguageModelSpec::shape() const {
  validate();
  return type == "llama" ? transformer_shape(llama) : transformer_shape(gpt);
}

ParamLayout LanguageModelSpec::layout() const { return transformer_layout(shape()); }

std::size_t LanguageModelSpec::workspace_bytes(std::size_t B, std::size_t T) const {
  return model::workspace_bytes(shape(), B, T);
}

std::unique_ptr<LanguageModel> LanguageModelSpec::make(kernels::KernelBackend& backend) const {
  return std::make_unique<Adapter>(shape(), backend);
}

}  // namespace scape::model
