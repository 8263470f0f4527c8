// Benchmarks of the mask codecs (core/mask_codec.hpp, kernels/cpu/codec.cpp) on 2^24
// coordinates at 90%, 99% and 99.9% sparsity: encode + decode of each encoding as a fraction
// of the throughput of the bitmap's pack_bits + unpack_bits (the reference, measured in the
// same run), with the message size in bits per coordinate. The delta encodings code against a
// previous mask that shares 57% of the positions (a Jaccard of 0.4 between steps).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/mask_codec.hpp"
#include "kernels/cpu/kernels.hpp"

namespace sk = scape::kernels;
using scape::MaskEncoding;

namespace {

constexpr std::size_t kN = std::size_t{1} << 24;
constexpr double kKept = 0.57;  // 2J / (1 + J) at J = 0.4
constexpr int kRepeats = 10;
constexpr double kSparsities[] = {0.9, 0.99, 0.999};

using Clock = std::chrono::steady_clock;
using Words = std::vector<std::uint64_t>;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Exactly k = (1 - sparsity) N positions; the next mask keeps kKept of them.
struct Masks {
  Words previous, current;
  std::size_t k = 0;
};

Masks make_masks(double sparsity, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  Masks m;
  m.k = static_cast<std::size_t>((1.0 - sparsity) * static_cast<double>(kN) + 0.5);
  std::vector<std::uint32_t> order(kN);
  for (std::size_t j = 0; j < kN; ++j) order[j] = static_cast<std::uint32_t>(j);
  std::shuffle(order.begin(), order.end(), rng);
  m.previous.assign(sk::words_for(kN), 0);
  m.current.assign(sk::words_for(kN), 0);
  const auto kept = static_cast<std::size_t>(kKept * static_cast<double>(m.k));
  for (std::size_t i = 0; i < m.k; ++i) m.previous[order[i] / 64] |= std::uint64_t{1} << (order[i] % 64);
  // current: the first `kept` of previous's positions, then fresh ones.
  for (std::size_t i = 0; i < m.k; ++i) {
    const std::uint32_t p = i < kept ? order[i] : order[m.k + i];
    m.current[p / 64] |= std::uint64_t{1} << (p % 64);
  }
  return m;
}

const Masks& masks(double sparsity) {
  static const Masks m90 = make_masks(0.9, 1), m99 = make_masks(0.99, 2), m999 = make_masks(0.999, 3);
  return sparsity == 0.9 ? m90 : (sparsity == 0.99 ? m99 : m999);
}

template <typename Work>
double best_seconds(Work work) {
  work();  // warm-up: page faults
  double best = 1e30;
  for (int r = 0; r < kRepeats; ++r) {
    const auto start = Clock::now();
    work();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

// The reference: the bitmap of the current mask packed from byte flags and unpacked again.
double bitmap_pack_unpack_seconds(const Masks& m) {
  std::vector<std::uint8_t> flags(kN);
  sk::unpack_bits(m.current, flags);
  Words words(sk::words_for(kN));
  return best_seconds([&] {
    sk::pack_bits(flags, words);
    sk::unpack_bits(words, flags);
    benchmark::DoNotOptimize(flags.data());
  });
}

void BM_codec(benchmark::State& state, MaskEncoding encoding, double sparsity) {
  const Masks& m = masks(sparsity);
  scape::ShardCoder coder(sk::cpu_backend());
  sk::Buffer<std::uint64_t> message(sk::cpu_backend());
  Words decoded(m.current.size());
  const auto round_trip = [&] {
    coder.encode(encoding, m.current, kN, m.k, m.previous, message);
    coder.decode(encoding, message.span(), kN, m.k, m.previous, decoded, 0);
    benchmark::DoNotOptimize(decoded.data());
  };
  round_trip();
  if (decoded != m.current) {
    state.SkipWithError("round trip differs");
    return;
  }
  double best = 1e30;
  for (auto _ : state) {
    const auto start = Clock::now();
    round_trip();
    const double s = seconds_since(start);
    best = std::min(best, s);
    state.SetIterationTime(s);
  }
  const double reference = bitmap_pack_unpack_seconds(m);
  state.counters["frac_of_bitmap_pack_unpack"] = reference / best;
  state.counters["bits_per_coordinate"] = 64.0 * static_cast<double>(message.size()) / static_cast<double>(kN);
  std::printf("%-12s sparsity %.3f: encode+decode %.2f ms, %.0f%% of bitmap pack+unpack (%.2f ms); %.4f bits per "
              "coordinate\n",
              scape::to_string(encoding), sparsity, 1e3 * best, 100.0 * reference / best, 1e3 * reference,
              64.0 * static_cast<double>(message.size()) / static_cast<double>(kN));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (const double sparsity : kSparsities) {
    for (const MaskEncoding e : {MaskEncoding::bitmap, MaskEncoding::elias_fano, MaskEncoding::delta,
                                 MaskEncoding::auto_select}) {
      const std::string name = std::string("BM_codec/") + scape::to_string(e) + "/" + std::to_string(sparsity);
      benchmark::RegisterBenchmark(name.c_str(), BM_codec, e, sparsity)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
