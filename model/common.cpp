// GPT-2-style initialization and the call checks shared by the language models.
#include "model/common.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string_view>

#include "util/rng.hpp"

namespace scape::model {
namespace {

enum class InitRule { kNormal, kResidual, kOnes, kZeros };

InitRule init_rule(std::string_view name) {
  const bool is_bias = name.ends_with(".b") || name.ends_with(".bias");
  const bool is_norm = name.starts_with("ln") || name.find(".ln") != std::string_view::npos ||
                       name.find("norm") != std::string_view::npos;
  if (is_bias) return InitRule::kZeros;
  if (is_norm) return InitRule::kOnes;
  if (name.ends_with("attn.proj.w") || name.ends_with("mlp.proj.w") || name.ends_with("mlp.down.w")) {
    return InitRule::kResidual;
  }
  return InitRule::kNormal;
}

// Below this many elements the init loop stays on the calling thread.
constexpr std::ptrdiff_t kMinParallelInit = 32768;

}  // namespace

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

template <class R>
void init_gpt2_style(const ParamLayout& layout, std::span<R> params, std::uint64_t seed, int n_layer,
                     const char* model) {
  require(params.size() == layout.size(), std::string(model) + "::init_params: params has " +
                                              std::to_string(params.size()) + " elements, layout needs " +
                                              std::to_string(layout.size()));
  const double residual_std = 0.02 / std::sqrt(2.0 * n_layer);
  const auto& slots = layout.slots();
  for (std::size_t s = 0; s < slots.size(); ++s) {
    const InitRule rule = init_rule(slots[s].name);
    R* p = params.data() + slots[s].offset;
    const auto n = static_cast<std::ptrdiff_t>(slots[s].numel());
    if (rule == InitRule::kZeros || rule == InitRule::kOnes) {
      std::fill(p, p + n, rule == InitRule::kOnes ? R(1) : R(0));
      continue;
    }
    const double std_dev = rule == InitRule::kResidual ? residual_std : 0.02;
    const std::uint64_t key = rng::derive(seed, s);  // one stream per tensor
#pragma omp parallel for schedule(static) if (n >= kMinParallelInit)
    for (std::ptrdiff_t i = 0; i < n; ++i) {
      p[i] = static_cast<R>(std_dev * rng::normal(key, static_cast<std::uint64_t>(i)));
    }
  }
}

template void init_gpt2_style<float>(const ParamLayout&, std::span<float>, std::uint64_t, int, const char*);
template void init_gpt2_style<double>(const ParamLayout&, std::span<double>, std::uint64_t, int, const char*);

void check_batch(const char* model, std::size_t params, std::size_t layout_size, std::span<const std::int32_t> inputs,
                 std::span<const std::int32_t> targets, int B, int T, int block_size, int vocab_size) {
  const std::string m(model);
  require(params == layout_size,
          m + ": params has " + std::to_string(params) + " elements, layout needs " + std::to_string(layout_size));
  require(B >= 1, m + ": batch size B = " + std::to_string(B) + " must be >= 1");
  require(T >= 1 && T <= block_size, m + ": sequence length T = " + std::to_string(T) + " must be in [1, " +
                                         std::to_string(block_size) + "] (block_size)");
  const auto n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  require(inputs.size() == n && targets.size() == n,
          m + ": inputs/targets have " + std::to_string(inputs.size()) + "/" + std::to_string(targets.size()) +
              " tokens, B*T = " + std::to_string(n));
  for (std::size_t i = 0; i < n; ++i) {
    for (std::int32_t tok : {inputs[i], targets[i]}) {
      if (tok < 0 || tok >= vocab_size) {
        throw std::out_of_range(m + ": token " + std::to_string(tok) + " at position " + std::to_string(i) +
                                " is outside [0, vocab_size = " + std::to_string(vocab_size) + ")");
      }
    }
  }
}

}  // namespace scape::model
