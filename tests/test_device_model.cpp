// Whole models on the CUDA backend against the CPU backend: one forward/backward of the GPT and
// of a grouped-query Llama on the same parameters and tokens, and the evaluation loss. The loss
// agrees within 1e-4 relative and every gradient tensor within 1e-4 relative L2 error (fp32
// rounding through a few layers of GEMMs, norms and softmaxes summed in different orders; a
// wrong op is O(1) off). Without a visible device the program prints why and exits 77.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/backend.hpp"
#include "model/gpt.hpp"
#include "model/llama.hpp"
#include "util/rng.hpp"

namespace sk = scape::kernels;
using namespace scape::model;

namespace {

sk::KernelBackend& gpu() {
  static const std::unique_ptr<sk::KernelBackend> backend = sk::make_backend(sk::DeviceKind::cuda);
  return *backend;
}

template <class Model, class Config>
void compare_on_devices(const Config& cfg, int B, int T) {
  Model on_cpu(cfg);
  Model on_gpu(cfg, gpu());
  const std::size_t n = on_cpu.num_params();
  std::vector<float> params(n), grads(n), gpu_grads(n);
  on_cpu.init_params(params, 5);
  for (std::size_t i = 0; i < n; ++i) params[i] += 0.05f * static_cast<float>(scape::rng::normal(77, i));
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<std::int32_t>(scape::rng::derive(21, i) % cfg.vocab_size);
    tg[i] = static_cast<std::int32_t>(scape::rng::derive(22, i) % cfg.vocab_size);
  }
  const double cpu_loss = on_cpu.forward_backward(params, in, tg, B, T, grads);

  sk::Buffer<float> device_params(gpu(), n), device_grads(gpu(), n);
  gpu().copy_bytes(params.data(), device_params.data(), n * sizeof(float));
  const double gpu_loss = on_gpu.forward_backward(device_params, in, tg, B, T, device_grads);
  gpu().copy_bytes(device_grads.data(), gpu_grads.data(), n * sizeof(float));
  gpu().synchronize();
  CHECK(std::abs(gpu_loss - cpu_loss) <= 1e-4 * std::abs(cpu_loss));
  for (const auto& slot : on_cpu.layout().slots()) {
    double diff = 0, norm = 0;
    for (std::size_t i = slot.offset; i < slot.end(); ++i) {
      diff += (gpu_grads[i] - grads[i]) * (gpu_grads[i] - grads[i]);
      norm += static_cast<double>(grads[i]) * grads[i];
    }
    INFO("tensor ", slot.name, ": relative L2 error ", std::sqrt(diff / norm));
    CHECK(std::sqrt(diff / norm) < 1e-4);
  }
  const double cpu_eval = on_cpu.loss(params, in, tg, B, T);
  const double gpu_eval = on_gpu.loss(device_params, in, tg, B, T);
  CHECK(std::abs(gpu_eval - cpu_eval) <= 1e-4 * std::abs(cpu_eval));
}

}  // namespace

TEST_CASE("GPT forward/backward on CUDA matches the CPU within 1e-4") {
  const GptConfig cfg{.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 64, .vocab_size = 256};
  compare_on_devices<Gpt>(cfg, 4, 64);
  compare_on_devices<Gpt>(cfg, 3, 17);  // T < block_size
}

TEST_CASE("Llama (grouped-query) forward/backward on CUDA matches the CPU within 1e-4") {
  const LlamaConfig cfg{.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 64, .block_size = 64, .vocab_size = 256};
  compare_on_devices<Llama>(cfg, 4, 64);
  compare_on_devices<Llama>(cfg, 3, 17);
}

TEST_CASE("a double-precision model refuses a CUDA backend") {
  const GptConfig cfg{.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 16};
  auto make = [&cfg] { GptDouble model(cfg, gpu()); };
  CHECK_THROWS_AS(make(), std::invalid_argument);
}
