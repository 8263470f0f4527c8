// Test helper for the CUDA-against-CPU comparisons (tests/test_cuda_kernels.cpp,
// test_cuda_passes.cpp, test_cuda_model_ops.cpp): the GPU backend, host <-> device copies, the
// bit-for-bit comparison and the input families every comparison draws from.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/stream.hpp"
#include "util/rng.hpp"

namespace scape::testing {

namespace sk = scape::kernels;
namespace gk = scape::kernels::cuda;
inline constexpr std::size_t kLarge = std::size_t{1} << 26;
inline const std::vector<std::size_t> kSmallSizes = {0, 1, 2, 63, 64, 65, 1000, 4097, 70'001, 300'007};

inline std::vector<std::size_t> small_sizes_and_large() {
  std::vector<std::size_t> sizes = kSmallSizes;
  sizes.push_back(kLarge);
  return sizes;
}

inline sk::KernelBackend& gpu() {
  static const std::unique_ptr<sk::KernelBackend> backend = sk::make_backend(sk::DeviceKind::cuda);
  return *backend;
}

// Host vector -> new Buffer on the GPU backend (queued on its stream).
template <typename T>
sk::Buffer<T> to_gpu(const std::vector<T>& host) {
  sk::Buffer<T> buffer(gpu(), host.size());
  gpu().copy_bytes(host.data(), buffer.data(), host.size() * sizeof(T));
  return buffer;
}

// Buffer -> host vector, after everything queued on the backend's stream.
template <typename T>
std::vector<T> to_host(const sk::Buffer<T>& buffer) {
  std::vector<T> host(buffer.size());
  gpu().copy_bytes(buffer.data(), host.data(), buffer.size() * sizeof(T));
  gpu().synchronize();
  return host;
}

// Runs a direct scape::kernels::cuda call (one the backend does not expose) after the
// backend's queued work, on this thread's current stream, and waits for it.
template <typename Call>
void run_direct(Call call) {
  gpu().synchronize();
  call();
  gk::synchronize_current_stream();
}

inline bool same_value(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}
template <typename T>
bool same_value(T a, T b) {
  return a == b;
}

// Every entry equal (floats: same bits, or both NaN); names the first difference.
template <typename T>
void check_equal(const std::vector<T>& cpu, const std::vector<T>& cuda, const std::string& what) {
  REQUIRE_MESSAGE(cpu.size() == cuda.size(), what);
  std::size_t differ = 0;
  std::size_t first = cpu.size();
  for (std::size_t j = 0; j < cpu.size(); ++j) {
    if (!same_value(cpu[j], cuda[j])) {
      if (differ++ == 0) first = j;
    }
  }
  if (differ != 0) {
    FAIL_CHECK(what << ": " << differ << " of " << cpu.size() << " entries differ, first at " << first << " (cpu "
                    << cpu[first] << ", cuda " << cuda[first] << ")");
  }
}

enum class Family { normal, ties, equal, special };
inline const char* name(Family f) {
  switch (f) {
    case Family::normal: return "normal";
    case Family::ties: return "ties";
    case Family::equal: return "equal";
    case Family::special: return "special";
  }
  return "?";
}
inline constexpr Family kFamilies[] = {Family::normal, Family::ties, Family::equal, Family::special};

inline std::string case_name(Family family, std::size_t n) {
  return std::string(name(family)) + " n=" + std::to_string(n);
}

// Runs check on every input family at every small size, in that order (the callers draw their
// seeds in it).
inline void for_each_small_case(const std::function<void(Family family, std::size_t n)>& check) {
  for (const Family family : kFamilies) {
    for (const std::size_t n : kSmallSizes) check(family, n);
  }
}

// Counter-based draws (util/rng.hpp), filled in parallel: 2^26 normals take a second serially.
inline std::vector<float> make_values(Family family, std::size_t n, std::uint32_t seed) {
  std::vector<float> x(n);
  const auto count = static_cast<std::int64_t>(n);
  const std::uint64_t key = scape::rng::derive(0x5eedull, seed);
  const float nan_payload = std::bit_cast<float>(0x7fc01234u);
  const float negative_nan = std::bit_cast<float>(0xffc00000u);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < count; ++i) {
    const auto j = static_cast<std::size_t>(i);
    float v = static_cast<float>(scape::rng::normal(key, j));
    switch (family) {
      case Family::normal: break;
      case Family::ties: {
        // Magnitudes 0.5 (both signs) and 2: the selection cuts through equal magnitudes.
        const float set[3] = {0.5f, -0.5f, 2.0f};
        v = set[static_cast<int>(scape::rng::uniform(key ^ 1u, j) * 3.0)];
        break;
      }
      case Family::equal: v = -1.25f; break;
      case Family::special:
        if (j % 7 == 3) v = std::numeric_limits<float>::quiet_NaN();
        if (j % 29 == 5) v = nan_payload;
        if (j % 31 == 6) v = negative_nan;
        if (j % 11 == 1) v = std::numeric_limits<float>::infinity();
        if (j % 13 == 2) v = -std::numeric_limits<float>::infinity();
        if (j % 17 == 4) v = -0.0f;
        if (j % 19 == 8) v = 0.0f;
        if (j % 23 == 9) v = 1e-40f * (j % 2 == 0 ? 1.0f : -1.0f);  // denormal
        break;
    }
    x[j] = v;
  }
  return x;
}

inline std::vector<std::size_t> ks_for(std::size_t n) {
  std::vector<std::size_t> ks = {0, 1, n / 100, n / 3, n / 2, n > 0 ? n - 1 : 0, n};
  ks.erase(std::remove_if(ks.begin(), ks.end(), [n](std::size_t k) { return k > n; }), ks.end());
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// Sorted distinct indices, about `density` of [0, n).
inline std::vector<std::uint32_t> random_indices(std::size_t n, double density, std::uint32_t seed) {
  const std::uint64_t key = scape::rng::derive(0x1d5ull, seed);
  std::vector<std::uint32_t> idx;
  for (std::size_t j = 0; j < n; ++j) {
    if (scape::rng::uniform(key, j) < density) idx.push_back(static_cast<std::uint32_t>(j));
  }
  return idx;
}

// Second moments: small and non-negative.
inline std::vector<float> positive_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> x = make_values(Family::normal, n, seed);
  for (float& v : x) v = 1e-4f * v * v;
  return x;
}

// Bias-corrected step t with beta2 = 0.999 (where 1 - beta2 in fp32 would differ) and decay.
inline sk::AdamScalars step_scalars(int t) {
  sk::AdamScalars s;
  s.lr = 3e-4;
  s.beta1 = 0.9;
  s.beta2 = 0.999;
  s.eps = 1e-8;
  s.decay = 1.0 - 3e-4 * 0.1;
  s.bc1 = 1.0 - std::pow(s.beta1, t);
  s.bc2 = 1.0 - std::pow(s.beta2, t);
  return s;
}

}  // namespace scape::testing
