// GPT and Llama forward+backward on the CUDA backend (built only with CUDA), as tokens/s and as
// a fraction of cuBLAS SGEMMs timed with CUDA events in the same run: the three products of the
// model's MLP up-projection at its own shape (y = x w^T, dx = dy w, dw = dy^T x with x [B T, C]
// and w [4C, C]), and a 4096^3 square SGEMM, the device's rate for that math. Each model runs
// three times: in fp32 (TF32 off, the backend's default, against fp32 references), with TF32
// GEMMs (kernels::set_cuda_tf32, against references in cuBLAS's TF32 math), and with
// model.precision = bf16 (gemm_bf16: operands converted to bf16, fp32 sums, against cuBLAS
// GEMMs on bf16 operands with fp32 compute, which need no conversion). Parameters, gradients and
// tokens live in the backend's Buffers. Model FLOPs: train_flops_per_token (model/transformer.hpp:
// 6 per matmul weight plus causal attention). Without a visible device it
// prints "no CUDA device visible: CUDA benchmarks skipped" and exits 0.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "model/language_model.hpp"
#include "util/rng.hpp"

namespace {

namespace sk = scape::kernels;
using scape::model::GptConfig;
using scape::model::LanguageModelSpec;
using scape::model::LlamaConfig;

struct Shape {
  const char* name;
  LanguageModelSpec spec;
  int batch;
  int iterations;  // fixed, so the setup (model, parameters, references) runs once per row
};

LanguageModelSpec gpt(const GptConfig& cfg) {
  LanguageModelSpec spec;
  spec.type = "gpt";
  spec.gpt = cfg;
  return spec;
}

LanguageModelSpec llama(const LlamaConfig& cfg) {
  LanguageModelSpec spec;
  spec.type = "llama";
  spec.llama = cfg;
  return spec;
}

// GPT-2 124M (vocabulary padded to 50304 as in llm.c), a Llama of the same width and depth with
// grouped-query attention (4 key/value heads), and the CPU benchmark's 10M shape.
const Shape kShapes[] = {
    {"gpt-124M",
     gpt({.n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 1024, .vocab_size = 50304}), 4, 10},
    {"llama-gqa",
     llama({.n_layer = 12, .n_head = 12, .n_kv_head = 4, .n_embd = 768, .block_size = 1024, .vocab_size = 50304}),
     4, 10},
    {"gpt-10M", gpt({.n_layer = 6, .n_head = 6, .n_embd = 384, .block_size = 256, .vocab_size = 256}), 16, 50},
};

int embd(const LanguageModelSpec& spec) { return spec.type == "llama" ? spec.llama.n_embd : spec.gpt.n_embd; }

double flops_per_token(const LanguageModelSpec& spec, int T) {
  return scape::model::train_flops_per_token(spec.shape(), T);
}

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS: ") + call + " failed: " + cublasGetStatusString(status));
  }
}

// Device memory for the references, filled with 0.0116 (bytes 0x3c), far from subnormals.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t n) {
    SCAPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(float)));
    SCAPE_CUDA_CHECK(cudaMemset(data_, 0x3c, n * sizeof(float)));
  }
  ~DeviceFloats() { (void)cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return data_; }

 private:
  float* data_ = nullptr;
};

// The arithmetic of a row: the model's GEMMs and the references'.
enum class Math { fp32, tf32, bf16 };

const char* to_string(Math m) { return m == Math::fp32 ? "fp32" : m == Math::tf32 ? "tf32" : "bf16"; }

// A cuBLAS handle on its own stream, in pedantic fp32 math (as the backend's GEMMs), in TF32
// tensor-op math (as they run after set_cuda_tf32(true)) or on bf16 operands (as gemm_bf16's
// GemmEx, without its conversions).
class Reference {
 public:
  explicit Reference(Math math) : math_(math) {
    SCAPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    check_cublas(cublasCreate(&handle_), "cublasCreate");
    check_cublas(cublasSetStream(handle_, stream_), "cublasSetStream");
    check_cublas(cublasSetMathMode(handle_, math == Math::tf32   ? CUBLAS_TF32_TENSOR_OP_MATH
                                            : math == Math::bf16 ? CUBLAS_DEFAULT_MATH
                                                                 : CUBLAS_PEDANTIC_MATH),
                 "cublasSetMathMode");
    SCAPE_CUDA_CHECK(cudaEventCreate(&start_));
    SCAPE_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Reference() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
    (void)cublasDestroy(handle_);
    (void)cudaStreamDestroy(stream_);
  }
  Reference(const Reference&) = delete;
  Reference& operator=(const Reference&) = delete;

  // Row-major C[M, N] = op(A) op(B), mapped onto column-major cuBLAS as the backend's gemm does.
  // In bf16 math the first elements of a's and b's memory are read as bf16 operands (a float
  // array holds twice as many bf16 values), as gemm_bf16 reads its converted copies.
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* a, const float* b, float* c) {
    const float one = 1.0f, zero = 0.0f;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (math_ == Math::bf16) {
      check_cublas(cublasGemmEx(handle_, op_b, op_a, N, M, K, &one, b, CUDA_R_16BF, trans_b ? K : N, a, CUDA_R_16BF,
                                trans_a ? M : K, &zero, c, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (bf16)");
      return;
    }
    check_cublas(cublasSgemm(handle_, op_b, op_a, N, M, K, &one, b, trans_b ? K : N, a, trans_a ? M : K, &zero, c, N),
                 "cublasSgemm");
  }

  // FLOP/s of `run` (which queues `flops` of GEMMs) over at least `seconds`, timed with events
  // after one warm-up run sizes the repetitions.
  template <class Run>
  double rate(double flops, double seconds, Run run) {
    const double once = elapsed_s(1, run);
    const int repeats = static_cast<int>(std::clamp(std::ceil(seconds / std::max(once, 1e-6)), 1.0, 10000.0));
    return flops * repeats / elapsed_s(repeats, run);
  }

 private:
  template <class Run>
  double elapsed_s(int repeats, Run run) {
    SCAPE_CUDA_CHECK(cudaEventRecord(start_, stream_));
    for (int i = 0; i < repeats; ++i) run(*this);
    SCAPE_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    SCAPE_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    SCAPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

  Math math_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The MLP up-projection's forward and backward products at N = B T tokens of width C.
double layer_gemm_rate(Reference& ref, long long N, int C, double seconds) {
  const int n = static_cast<int>(N), F = 4 * C;
  DeviceFloats x(N * C), w(static_cast<std::size_t>(F) * C), y(N * F), dy(N * F), dx(N * C),
      dw(static_cast<std::size_t>(F) * C);
  const double flops = 3 * 2.0 * static_cast<double>(N) * C * F;
  return ref.rate(flops, seconds, [&](Reference& r) {
    r.gemm(false, true, n, F, C, x.get(), w.get(), y.get());    // y = x w^T
    r.gemm(false, false, n, C, F, dy.get(), w.get(), dx.get());  // dx = dy w
    r.gemm(true, false, F, C, n, dy.get(), x.get(), dw.get());   // dw = dy^T x
  });
}

double peak_gemm_rate(Reference& ref, double seconds) {
  constexpr int kSize = 4096;
  const std::size_t n = static_cast<std::size_t>(kSize) * kSize;
  DeviceFloats a(n), b(n), c(n);
  return ref.rate(2.0 * kSize * kSize * static_cast<double>(kSize), seconds,
                  [&](Reference& r) { r.gemm(false, false, kSize, kSize, kSize, a.get(), b.get(), c.get()); });
}

sk::KernelBackend& gpu() {
  static const std::unique_ptr<sk::KernelBackend> backend = sk::make_backend(sk::DeviceKind::cuda);
  return *backend;
}

// Restores the backend's default (TF32 off) when a benchmark ends, also by an exception.
struct Tf32Scope {
  explicit Tf32Scope(bool on) { sk::set_cuda_tf32(on); }
  ~Tf32Scope() { sk::set_cuda_tf32(false); }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;
};

void BM_CudaForwardBackward(benchmark::State& state, int shape, Math math) {
  const Shape& z = kShapes[shape];
  const int B = z.batch, T = z.spec.block_size(), V = z.spec.vocab_size();
  const Tf32Scope tf32_scope(math == Math::tf32);
  LanguageModelSpec spec = z.spec;
  spec.gpt.precision = spec.llama.precision =
      math == Math::bf16 ? scape::model::Precision::bf16 : scape::model::Precision::fp32;
  auto model = spec.make(gpu());
  const std::size_t n = model->layout().size(), tokens_n = static_cast<std::size_t>(B) * T;
  // Filled on the host and copied, rather than written through managed memory page by page.
  std::vector<float> host_params(n);
  model->init_params(host_params, 1);
  std::vector<std::int32_t> host_inputs(tokens_n), host_targets(tokens_n);
  for (std::size_t i = 0; i < tokens_n; ++i) {
    host_inputs[i] = static_cast<std::int32_t>(scape::rng::derive(1, i) % static_cast<std::uint64_t>(V));
    host_targets[i] = static_cast<std::int32_t>(scape::rng::derive(2, i) % static_cast<std::uint64_t>(V));
  }
  sk::Buffer<float> params(gpu(), n), grads(gpu(), n);
  sk::Buffer<std::int32_t> inputs(gpu(), tokens_n), targets(gpu(), tokens_n);
  gpu().copy_bytes(host_params.data(), params.data(), params.bytes());
  gpu().copy_bytes(host_inputs.data(), inputs.data(), inputs.bytes());
  gpu().copy_bytes(host_targets.data(), targets.data(), targets.bytes());
  gpu().synchronize();
  const auto step = [&] {
    const double loss = model->forward_backward(params.span(), inputs.span(), targets.span(), B, T, grads.span());
    gpu().synchronize();
    return loss;
  };
  step();  // allocates the workspace

  // The references bracket the model's timing, so both see the same clocks and temperature.
  Reference ref(math);
  const double layer_before = layer_gemm_rate(ref, static_cast<long long>(tokens_n), embd(z.spec), 0.25);
  const double peak_before = peak_gemm_rate(ref, 0.25);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) benchmark::DoNotOptimize(step());
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double layer =
      0.5 * (layer_before + layer_gemm_rate(ref, static_cast<long long>(tokens_n), embd(z.spec), 0.25));
  const double peak = 0.5 * (peak_before + peak_gemm_rate(ref, 0.25));

  const double tokens = static_cast<double>(tokens_n);
  const double model_flops = tokens * flops_per_token(z.spec, T) * static_cast<double>(state.iterations()) / elapsed;
  state.counters["params"] = static_cast<double>(n);
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_TFLOP/s"] = model_flops / 1e12;
  state.counters["layer_gemm_TFLOP/s"] = layer / 1e12;
  state.counters["peak_gemm_TFLOP/s"] = peak / 1e12;
  state.counters["frac_of_layer_gemm"] = model_flops / layer;
  state.counters["frac_of_peak_gemm"] = model_flops / peak;
  state.SetLabel(std::string(z.name) + " B=" + std::to_string(B) + " T=" + std::to_string(T) +
                 " " + to_string(math));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (sk::cuda_device_count() == 0) {
    std::puts("no CUDA device visible: CUDA benchmarks skipped");
    return 0;
  }
  for (int s = 0; s < static_cast<int>(std::size(kShapes)); ++s) {
    for (const Math math : {Math::fp32, Math::tf32, Math::bf16}) {
      const std::string name = std::string("model_forward_backward/") + kShapes[s].name + "/" + to_string(math);
      benchmark::RegisterBenchmark(name.c_str(), BM_CudaForwardBackward, s, math)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(kShapes[s].iterations);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
