// Benchmarks of the CUDA kernels (kernels/cuda), timed with CUDA events, each reported against
// a reference measured in the same run, never as a bare time:
//   - elementwise and bitmask kernels at N = 2^28: effective bandwidth (bytes the kernel must
//     read and write / time) as a fraction of a device-to-device cudaMemcpy (frac_of_d2d);
//   - top-k with k = 1% of 2^28 against cub::DeviceRadixSort::SortPairs (keys + indices) of
//     the same data (speedup_vs_cub_sort);
//   - the ChunkCopier round trip (upload, a kernel on the slot, download) against plain pinned
//     H2D + D2H copies of the same bytes (frac_of_pinned_copy).
// Without a visible device it prints why and exits 0 without running anything.
#include <benchmark/benchmark.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/stream.hpp"
#include "util/rng.hpp"

namespace sk = scape::kernels;
namespace gk = scape::kernels::cuda;

namespace {

constexpr std::size_t kN = std::size_t{1} << 28;
constexpr std::size_t kTopK = kN / 100;
constexpr std::size_t kSparseK = kN / 100;  // compaction at 1% density
constexpr int kReferenceRepeats = 5;

// Device arrays shared by every benchmark (cudaMalloc, freed at exit).
struct DeviceData {
  float* theta = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* g = nullptr;
  float* out = nullptr;
  std::uint8_t* flags = nullptr;
  std::uint64_t* words = nullptr;
  std::uint32_t* idx = nullptr;
  float* compacted = nullptr;
};
DeviceData g_data;
cudaStream_t g_stream = nullptr;

struct References {
  double d2d_gbps = 0.0;           // cudaMemcpy device to device, read + write bytes
  double cub_sort_seconds = 0.0;   // SortPairs of kN (key, index) pairs
  double pinned_copy_gbps = 0.0;   // pinned H2D then D2H, bytes both ways / time
};
References g_refs;

template <typename T>
T* device_array(std::size_t n) {
  T* p = nullptr;
  SCAPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
  return p;
}

// Seconds the work queued by f takes on g_stream, from events around it.
template <typename F>
double gpu_seconds(F&& f) {
  cudaEvent_t start, stop;
  SCAPE_CUDA_CHECK(cudaEventCreate(&start));
  SCAPE_CUDA_CHECK(cudaEventCreate(&stop));
  SCAPE_CUDA_CHECK(cudaEventRecord(start, g_stream));
  f();
  SCAPE_CUDA_CHECK(cudaEventRecord(stop, g_stream));
  SCAPE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  SCAPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  SCAPE_CUDA_CHECK(cudaEventDestroy(start));
  SCAPE_CUDA_CHECK(cudaEventDestroy(stop));
  return static_cast<double>(ms) * 1e-3;
}

// Gradient-like values: standard normals by Box-Muller on counter-based uniforms.
__global__ void normal_kernel(float* x, std::size_t n, std::uint64_t key, float scale) {
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const double u1 = 1.0 - scape::rng::uniform(key, 2 * j);
    const double u2 = scape::rng::uniform(key, 2 * j + 1);
    x[j] = scale * static_cast<float>(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

__global__ void flags_kernel(std::uint8_t* flags, std::size_t n, std::uint64_t key) {
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    flags[j] = scape::rng::uniform(key, j) < 0.1 ? 1 : 0;
  }
}

__global__ void abs_kernel(float* x, std::size_t n) {
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    x[j] = fabsf(x[j]);
  }
}

// (|x| bits, index) pairs for the sort reference.
__global__ void key_index_kernel(const float* x, std::uint32_t* keys, std::uint32_t* index, std::size_t n) {
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    keys[j] = __float_as_uint(x[j]) & 0x7fffffffu;
    index[j] = static_cast<std::uint32_t>(j);
  }
}

void fill_normal(float* x, std::size_t n, std::uint64_t key, float scale) {
  normal_kernel<<<4096, 256, 0, g_stream>>>(x, n, key, scale);
  SCAPE_CUDA_CHECK_LAUNCH();
}

void setup_data() {
  SCAPE_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  gk::set_current_stream(g_stream);
  g_data.theta = device_array<float>(kN);
  g_data.m = device_array<float>(kN);
  g_data.v = device_array<float>(kN);
  g_data.g = device_array<float>(kN);
  g_data.out = device_array<float>(kN);
  g_data.flags = device_array<std::uint8_t>(kN);
  g_data.words = device_array<std::uint64_t>(sk::words_for(kN));
  g_data.idx = device_array<std::uint32_t>(kSparseK);
  g_data.compacted = device_array<float>(kSparseK);
  fill_normal(g_data.theta, kN, 1, 1.0f);
  fill_normal(g_data.m, kN, 2, 0.01f);
  fill_normal(g_data.v, kN, 3, 1e-4f);
  abs_kernel<<<4096, 256, 0, g_stream>>>(g_data.v, kN);  // second moments are non-negative
  SCAPE_CUDA_CHECK_LAUNCH();
  fill_normal(g_data.g, kN, 4, 1.0f);
  flags_kernel<<<4096, 256, 0, g_stream>>>(g_data.flags, kN, 5);
  SCAPE_CUDA_CHECK_LAUNCH();
  // The 1% index list: the top-k of g.
  gk::topk_abs_indices({g_data.g, kN}, kSparseK, {g_data.idx, kSparseK});
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

void measure_references() {
  // Device-to-device copy of kN floats: 2 * 4 * kN bytes touched.
  double best = 1e30;
  for (int r = 0; r < kReferenceRepeats + 1; ++r) {
    const double s = gpu_seconds([] {
      SCAPE_CUDA_CHECK(cudaMemcpyAsync(g_data.out, g_data.g, kN * sizeof(float), cudaMemcpyDeviceToDevice, g_stream));
    });
    if (r > 0) best = std::min(best, s);
  }
  g_refs.d2d_gbps = 2.0 * kN * sizeof(float) / best / 1e9;

  // cub::DeviceRadixSort::SortPairs of (|x| bits, index), descending, all 32 key bits.
  std::uint32_t* keys_in = device_array<std::uint32_t>(kN);
  std::uint32_t* keys_out = device_array<std::uint32_t>(kN);
  std::uint32_t* vals_in = device_array<std::uint32_t>(kN);
  std::uint32_t* vals_out = device_array<std::uint32_t>(kN);
  key_index_kernel<<<4096, 256, 0, g_stream>>>(g_data.g, keys_in, vals_in, kN);
  SCAPE_CUDA_CHECK_LAUNCH();
  std::size_t temp_bytes = 0;
  SCAPE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, keys_in, keys_out, vals_in, vals_out,
                                                             kN, 0, 32, g_stream));
  void* temp = nullptr;
  SCAPE_CUDA_CHECK(cudaMalloc(&temp, temp_bytes));
  best = 1e30;
  for (int r = 0; r < kReferenceRepeats + 1; ++r) {
    const double s = gpu_seconds([&] {
      SCAPE_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, keys_in, keys_out, vals_in,
                                                                 vals_out, kN, 0, 32, g_stream));
    });
    if (r > 0) best = std::min(best, s);
  }
  g_refs.cub_sort_seconds = best;
  SCAPE_CUDA_CHECK(cudaFree(temp));
  SCAPE_CUDA_CHECK(cudaFree(keys_in));
  SCAPE_CUDA_CHECK(cudaFree(keys_out));
  SCAPE_CUDA_CHECK(cudaFree(vals_in));
  SCAPE_CUDA_CHECK(cudaFree(vals_out));

  // Pinned host <-> device: 2^26 floats up, then down.
  constexpr std::size_t kCopy = std::size_t{1} << 26;
  float* host = nullptr;
  SCAPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host), kCopy * sizeof(float)));
  std::fill(host, host + kCopy, 1.0f);
  best = 1e30;
  for (int r = 0; r < kReferenceRepeats + 1; ++r) {
    const double s = gpu_seconds([&] {
      SCAPE_CUDA_CHECK(cudaMemcpyAsync(g_data.out, host, kCopy * sizeof(float), cudaMemcpyHostToDevice, g_stream));
      SCAPE_CUDA_CHECK(cudaMemcpyAsync(host, g_data.out, kCopy * sizeof(float), cudaMemcpyDeviceToHost, g_stream));
    });
    if (r > 0) best = std::min(best, s);
  }
  g_refs.pinned_copy_gbps = 2.0 * kCopy * sizeof(float) / best / 1e9;
  SCAPE_CUDA_CHECK(cudaFreeHost(host));
}

// Runs `work` once per iteration, timed with events; reports GB/s for `bytes` per iteration and
// the fraction of the device-to-device copy. Returns the best iteration's seconds.
template <typename F>
double run_timed(benchmark::State& state, double bytes, F&& work) {
  work();  // warm-up (first-touch of scratch pools, module load)
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  double total = 0.0, best = 1e30;
  std::int64_t iterations = 0;
  for (auto _ : state) {
    const double s = gpu_seconds(work);
    state.SetIterationTime(s);
    total += s;
    best = std::min(best, s);
    ++iterations;
  }
  const double mean = total / static_cast<double>(std::max<std::int64_t>(1, iterations));
  state.counters["GB/s"] = bytes / mean / 1e9;
  state.counters["frac_of_d2d"] = bytes / mean / 1e9 / g_refs.d2d_gbps;
  return best;
}

constexpr double kF = sizeof(float);

void BM_adams_step(benchmark::State& state) {
  sk::AdamScalars s;
  s.lr = 1e-4;
  s.bc1 = 0.5;
  // Reads theta, m, g; writes theta, m.
  run_timed(state, 5 * kF * kN, [&] { gk::adams_step({g_data.theta, kN}, {g_data.m, kN}, {g_data.g, kN}, s); });
}

void BM_adamw_step(benchmark::State& state) {
  sk::AdamScalars s;
  s.lr = 1e-4;
  s.bc1 = 0.5;
  s.bc2 = 0.25;
  // Reads theta, m, v, g; writes theta, m, v.
  run_timed(state, 7 * kF * kN,
            [&] { gk::adamw_step({g_data.theta, kN}, {g_data.m, kN}, {g_data.v, kN}, {g_data.g, kN}, s); });
}

void BM_pack_bits(benchmark::State& state) {
  // Reads N flag bytes, writes N/8 bytes.
  run_timed(state, kN + kN / 8.0, [&] { gk::pack_bits({g_data.flags, kN}, {g_data.words, sk::words_for(kN)}); });
}

void BM_accumulate(benchmark::State& state) {
  // Reads acc and g, writes acc (plus the count read back, which synchronizes).
  run_timed(state, 3 * kF * kN, [&] { benchmark::DoNotOptimize(gk::accumulate({g_data.out, kN}, {g_data.g, kN})); });
}

void BM_compact(benchmark::State& state) {
  // Reads k indices and k gathered values, writes k values (1% density, sorted indices).
  run_timed(state, 3 * kF * kSparseK,
            [&] { gk::compact({g_data.g, kN}, {g_data.idx, kSparseK}, {g_data.compacted, kSparseK}); });
}

void BM_first_moment_statistic(benchmark::State& state) {
  // Reads m and a, writes the statistic.
  run_timed(state, 3 * kF * kN,
            [&] { gk::first_moment_statistic({g_data.m, kN}, {g_data.g, kN}, 0.9f, 0.1f, {g_data.out, kN}); });
}

void BM_topk_abs_mask(benchmark::State& state) {
  // "Bytes" = one read of the values and the mask write: what a single-pass select would touch.
  const double best = run_timed(state, kF * kN + kN / 8.0, [&] {
    gk::topk_abs_mask({g_data.g, kN}, kTopK, {g_data.words, sk::words_for(kN)});
  });
  state.counters["speedup_vs_cub_sort"] = g_refs.cub_sort_seconds / best;
  state.counters["cub_sort_ms"] = g_refs.cub_sort_seconds * 1e3;
}

// The offloaded-residual pattern: 2^26 floats in chunks of 2^22 through the two slots, each
// chunk uploaded, scaled on the device and downloaded, against plain pinned copies.
void BM_chunk_copier_round_trip(benchmark::State& state) {
  constexpr std::size_t kTotal = std::size_t{1} << 26;
  constexpr std::size_t kChunk = std::size_t{1} << 22;
  const std::unique_ptr<sk::KernelBackend> backend = sk::make_backend(sk::DeviceKind::cuda);
  auto* host = static_cast<float*>(backend->allocate_pinned_host(kTotal * sizeof(float)));
  std::fill(host, host + kTotal, 1.0f);
  auto copier = backend->make_chunk_copier(kChunk);
  auto pass = [&] {
    for (std::size_t c = 0, first = 0; first < kTotal; ++c, first += kChunk) {
      const int s = static_cast<int>(c % 2);
      copier->upload(s, host + first, kChunk);
      copier->wait_upload(s);
      backend->scale(copier->slot(s), 1.0000001f);
      copier->download(s, host + first, kChunk);
    }
    copier->finish();
  };
  pass();  // warm-up
  double total = 0.0;
  std::int64_t iterations = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(s);
    total += s;
    ++iterations;
  }
  const double gbps =
      2.0 * kTotal * sizeof(float) / (total / static_cast<double>(std::max<std::int64_t>(1, iterations))) / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["pinned_copy_GB/s"] = g_refs.pinned_copy_gbps;
  state.counters["frac_of_pinned_copy"] = gbps / g_refs.pinned_copy_gbps;
  copier.reset();
  backend->deallocate_pinned_host(host);
}

}  // namespace

int main(int argc, char** argv) {
  if (sk::cuda_device_count() == 0) {
    std::puts("no CUDA device visible: CUDA benchmarks skipped");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  setup_data();
  measure_references();
  std::printf("references: d2d copy %.0f GB/s, cub SortPairs(2^28) %.2f ms, pinned H2D+D2H %.1f GB/s\n",
              g_refs.d2d_gbps, g_refs.cub_sort_seconds * 1e3, g_refs.pinned_copy_gbps);
  benchmark::AddCustomContext("d2d_copy_GB/s", std::to_string(g_refs.d2d_gbps));
  benchmark::AddCustomContext("cub_sort_pairs_2^28_ms", std::to_string(g_refs.cub_sort_seconds * 1e3));
  benchmark::AddCustomContext("pinned_h2d_d2h_GB/s", std::to_string(g_refs.pinned_copy_gbps));

  for (auto* b : {benchmark::RegisterBenchmark("adams_step/2^28", BM_adams_step),
                  benchmark::RegisterBenchmark("adamw_step/2^28", BM_adamw_step),
                  benchmark::RegisterBenchmark("pack_bits/2^28", BM_pack_bits),
                  benchmark::RegisterBenchmark("accumulate/2^28", BM_accumulate),
                  benchmark::RegisterBenchmark("compact/2^28/k=1%", BM_compact),
                  benchmark::RegisterBenchmark("first_moment_statistic/2^28", BM_first_moment_statistic),
                  benchmark::RegisterBenchmark("topk_abs_mask/2^28/k=1%", BM_topk_abs_mask)}) {
    b->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
  }
  benchmark::RegisterBenchmark("chunk_copier_round_trip/2^26", BM_chunk_copier_round_trip)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.5);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
