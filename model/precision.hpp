// The arithmetic of a model's matrix multiplies (model.precision): fp32 throughout, or bf16
// mixed precision, where every linear layer's GEMMs (forward and both backward products, the
// output head included) take bf16-rounded operands and sum in fp32, while parameters (the
// master weights), gradients, activations, norms, attention and the loss stay fp32.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace scape::model {

enum class Precision { fp32, bf16 };

inline const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

// Throws std::invalid_argument naming the value unless it is "fp32" or "bf16".
inline Precision parse_precision(std::string_view name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  throw std::invalid_argument("model.precision: unknown value \"" + std::string(name) + "\" (fp32 or bf16)");
}

}  // namespace scape::model
