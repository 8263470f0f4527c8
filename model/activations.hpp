// The activation workspace of a language model: per-layer activations (one Buffer per kind,
// holding that kind for every layer), buffers used once per pass, and the token ids, all in
// memory of the model's backend. Buffers only grow, so alternating shapes (train batch, eval
// batch) reuse the largest allocation. Every buffer starts on the backend's allocation
// boundary, so results do not depend on where a reallocation lands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.hpp"

namespace scape::model {

// Element counts of a workspace's kinds for one shape: per-layer kinds (each held once per
// layer) and single kinds. bytes() adds the two int32 token arrays of N tokens, as ensure()
// allocates them: the workspace's memory, for device_memory_estimate.
struct ActivationSizes {
  std::vector<std::size_t> layer, single;
  std::size_t bytes(std::ptrdiff_t layers, std::size_t real_bytes, std::size_t tokens) const {
    std::size_t elements = 0;
    for (const std::size_t n : layer) elements += static_cast<std::size_t>(layers) * n;
    for (const std::size_t n : single) elements += n;
    return elements * real_bytes + 2 * tokens * sizeof(std::int32_t);
  }
};

template <class R>
class Activations {
 public:
  Activations(kernels::KernelBackend& backend, int layer_kinds, int single_kinds)
      : backend_(&backend), inputs_(backend), targets_(backend) {
    for (int k = 0; k < layer_kinds; ++k) layer_.emplace_back(backend);
    for (int k = 0; k < single_kinds; ++k) single_.emplace_back(backend);
  }

  // Sizes (elements) of each kind for the current shape; per-layer kinds hold `layers` copies.
  void ensure(std::ptrdiff_t layers, std::vector<std::size_t> layer_sizes, std::vector<std::size_t> single_sizes,
              std::size_t tokens) {
    layer_sizes_ = std::move(layer_sizes);
    single_sizes_ = std::move(single_sizes);
    for (std::size_t k = 0; k < layer_.size(); ++k) fit(layer_[k], static_cast<std::size_t>(layers) * layer_sizes_[k]);
    for (std::size_t k = 0; k < single_.size(); ++k) fit(single_[k], single_sizes_[k]);
    fit(inputs_, tokens);
    fit(targets_, tokens);
    tokens_ = tokens;
  }

  std::span<R> layer(int kind, std::ptrdiff_t l) {
    const std::size_t n = layer_sizes_[static_cast<std::size_t>(kind)];
    return {layer_[static_cast<std::size_t>(kind)].data() + static_cast<std::size_t>(l) * n, n};
  }
  std::span<R> single(int kind) {
    return {single_[static_cast<std::size_t>(kind)].data(), single_sizes_[static_cast<std::size_t>(kind)]};
  }

  // Copies the host's token ids into the backend's memory (queued).
  void set_tokens(const std::int32_t* inputs, const std::int32_t* targets) {
    backend_->copy_bytes(inputs, inputs_.data(), tokens_ * sizeof(std::int32_t));
    backend_->copy_bytes(targets, targets_.data(), tokens_ * sizeof(std::int32_t));
  }
  std::span<const std::int32_t> inputs() const { return {inputs_.data(), tokens_}; }
  std::span<const std::int32_t> targets() const { return {targets_.data(), tokens_}; }

 private:
  template <class T>
  static void fit(kernels::Buffer<T>& b, std::size_t n) {
    if (b.size() < n) b.resize(n);
  }

  kernels::KernelBackend* backend_;
  std::vector<kernels::Buffer<R>> layer_, single_;
  kernels::Buffer<std::int32_t> inputs_, targets_;
  std::vector<std::size_t> layer_sizes_, single_sizes_;
  std::size_t tokens_ = 0;
};

}  // namespace scape::model
