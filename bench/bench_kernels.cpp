// Benchmarks of the CPU kernels (Adam steps, bitmasks, compaction, top-k) and of the
// baselines' compressors on 2^24 elements, each reported as a fraction of a STREAM triad
// measured in the same run; top-k is also compared with std::nth_element on the same data.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <omp.h>

#include "kernels/cpu/kernels.hpp"

namespace sk = scape::kernels;

namespace {

constexpr std::size_t kN = std::size_t{1} << 24;
constexpr std::size_t kSparseK = kN / 100;  // 1% density for the masked kernels and top-k
constexpr int kReferenceRepeats = 20;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Measured once in main before any benchmark runs.
struct References {
  double triad_gbps = 0.0;
  double nth_element_seconds = 0.0;
};
References g_refs;

// The best repetition of each kernel: on a shared machine the slow runs measure the neighbours.
struct SummaryRow {
  double gbps = 0.0;
  double seconds_per_iteration = 0.0;
  std::string note;
};
std::vector<std::pair<std::string, SummaryRow>> g_summary;  // in the order the benchmarks ran

SummaryRow& summary_row(const std::string& name) {
  for (auto& [row_name, row] : g_summary) {
    if (row_name == name) return row;
  }
  return g_summary.emplace_back(name, SummaryRow{}).second;
}

// a = b + s*c with the same OpenMP schedule as the kernels; STREAM counts 12 bytes per element
// (two reads, one write; the write-allocate read is not counted).
void triad(float* a, const float* b, const float* c, float s, std::size_t n) {
  const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < count; ++i) a[i] = b[i] + s * c[i];
}

double measure_triad_gbps() {
  std::vector<float> a(kN, 0.0f), b(kN, 1.0f), c(kN, 2.0f);
  triad(a.data(), b.data(), c.data(), 3.0f, kN);  // warm-up: page faults and thread start
  double best = 1e30;
  for (int r = 0; r < kReferenceRepeats; ++r) {
    const auto start = Clock::now();
    triad(a.data(), b.data(), c.data(), 3.0f, kN);
    benchmark::DoNotOptimize(a.data());
    best = std::min(best, seconds_since(start));
  }
  return 12.0 * static_cast<double>(kN) / best / 1e9;
}

std::vector<float> gradient_like(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// The nth_element route to a top-k threshold: |x| copied (it must not reorder x), then an
// introselect. The mask-writing pass it would still need is left out, favouring nth_element.
double nth_element_once(const std::vector<float>& x, std::vector<float>& scratch) {
  const auto start = Clock::now();
  std::transform(x.begin(), x.end(), scratch.begin(), [](float v) { return std::fabs(v); });
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(kSparseK - 1), scratch.end(),
                   std::greater<>());
  benchmark::DoNotOptimize(scratch.data());
  return seconds_since(start);
}

struct BenchData {
  std::vector<float> theta, m, v, g, acc, x;
  std::vector<std::uint8_t> flags;
  std::vector<std::uint64_t> sparse_words;  // top 1% of |x|
  std::vector<std::uint32_t> sparse_idx;
  std::vector<float> packed, m_new, g_bar;  // kSparseK entries each
};

BenchData make_data() {
  BenchData d;
  d.x = gradient_like(kN, 1);
  d.g = gradient_like(kN, 2);
  d.theta = gradient_like(kN, 3);
  d.m.assign(kN, 0.01f);
  d.v.assign(kN, 1e-4f);
  d.acc.assign(kN, 0.0f);
  d.flags.resize(kN);
  for (std::size_t j = 0; j < kN; ++j) d.flags[j] = std::fabs(d.x[j]) > 1.0f ? 1 : 0;
  d.sparse_words.resize(sk::words_for(kN));
  sk::topk_abs_mask(d.x, kSparseK, d.sparse_words);
  d.sparse_idx.resize(kSparseK);
  sk::bits_to_indices(d.sparse_words, 0, d.sparse_idx);
  d.packed.resize(kSparseK);
  d.m_new.assign(kSparseK, 0.02f);
  d.g_bar.assign(kSparseK, 0.5f);
  return d;
}

BenchData& data() {
  static BenchData d = make_data();
  return d;
}

sk::AdamScalars adam_scalars() {
  sk::AdamScalars s;
  s.lr = 1e-4;
  s.decay = 1.0 - 1e-5;
  s.bc1 = 0.5;
  s.bc2 = 0.3;
  return s;
}

// Times the benchmark loop on the wall clock (the kernels are multi-threaded), reports the
// bytes each iteration moves as a rate and as a fraction of the triad, and returns the
// seconds per iteration.
template <typename Body>
double run_kernel(benchmark::State& state, const std::string& name, double bytes_per_iteration, Body body,
                  const std::string& note = "") {
  const auto start = Clock::now();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  const double elapsed = seconds_since(start);
  const auto iterations = static_cast<double>(state.iterations());
  const double gbps = bytes_per_iteration * iterations / elapsed / 1e9;
  state.counters["bytes_per_second"] =
      benchmark::Counter(bytes_per_iteration * iterations, benchmark::Counter::kIsRate);
  state.counters["frac_of_triad"] = gbps / g_refs.triad_gbps;
  SummaryRow& row = summary_row(name);
  if (gbps > row.gbps) row = {gbps, elapsed / iterations, note};
  return elapsed / iterations;
}

const std::string kTopkRow = "topk_abs_mask 1%";

constexpr double kFloats = static_cast<double>(kN);
constexpr double kSparse = static_cast<double>(kSparseK);

void BM_triad(benchmark::State& state) {
  std::vector<float> a(kN, 0.0f), b(kN, 1.0f), c(kN, 2.0f);
  run_kernel(state, "triad", 12.0 * kFloats, [&] { triad(a.data(), b.data(), c.data(), 3.0f, kN); });
}

void BM_adams_step(benchmark::State& state) {
  BenchData& d = data();
  run_kernel(state, "adams_step", 20.0 * kFloats, [&] { sk::adams_step(d.theta, d.m, d.g, adam_scalars()); });
}

void BM_adamw_step(benchmark::State& state) {
  BenchData& d = data();
  run_kernel(state, "adamw_step", 28.0 * kFloats, [&] { sk::adamw_step(d.theta, d.m, d.v, d.g, adam_scalars()); });
}

// Counted bytes per index: idx, m_new, g_bar read (12) + theta and m read and written (16).
// Each touched element sits on its own cache line at 1%, so the memory system moves far more
// than this; but the same 1% of lines (~11 MB per array) is touched every iteration and can
// stay in the 32 MB L3, which a training step that streams the dense arrays would not allow.
void BM_adams_step_masked(benchmark::State& state) {
  BenchData& d = data();
  run_kernel(
      state, "adams_step_masked 1%", 28.0 * kSparse,
      [&] { sk::adams_step_masked(d.theta, d.m, d.sparse_idx, d.m_new, d.g_bar, adam_scalars()); },
      "useful bytes; lines L3-resident");
}

void BM_pack_bits(benchmark::State& state) {
  BenchData& d = data();
  std::vector<std::uint64_t> words(sk::words_for(kN));
  run_kernel(state, "pack_bits", kFloats + kFloats / 8, [&] { sk::pack_bits(d.flags, words); });
}

void BM_popcount(benchmark::State& state) {
  BenchData& d = data();
  run_kernel(
      state, "popcount", kFloats / 8, [&] { benchmark::DoNotOptimize(sk::popcount(d.sparse_words)); },
      "2 MiB input, cache-resident");
}

void BM_bits_to_indices(benchmark::State& state) {
  BenchData& d = data();
  std::vector<std::uint32_t> out(kSparseK);
  run_kernel(state, "bits_to_indices 1%", kFloats / 8 + 4.0 * kSparse,
             [&] { benchmark::DoNotOptimize(sk::bits_to_indices(d.sparse_words, 0, out)); });
}

// Counted bytes per index: idx read, one value gathered or scattered, one written (12).
void BM_compact(benchmark::State& state) {
  BenchData& d = data();
  run_kernel(
      state, "compact 1%", 12.0 * kSparse, [&] { sk::compact(d.x, d.sparse_idx, d.packed); },
      "useful bytes; lines L3-resident");
}

void BM_expand(benchmark::State& state) {
  BenchData& d = data();
  run_kernel(
      state, "expand 1%", 12.0 * kSparse, [&] { sk::expand(d.m_new, d.sparse_idx, d.acc); },
      "useful bytes; lines L3-resident");
}

void BM_accumulate(benchmark::State& state) {
  BenchData& d = data();
  run_kernel(state, "accumulate", 12.0 * kFloats, [&] { benchmark::DoNotOptimize(sk::accumulate(d.acc, d.g)); });
}

// Counted bytes: one read of x plus the mask write, the least any top-k must move; the
// radix select reads x twice.
void BM_topk_abs_mask(benchmark::State& state) {
  BenchData& d = data();
  std::vector<std::uint64_t> words(sk::words_for(kN));
  const double seconds = run_kernel(
      state, kTopkRow, 4.0 * kFloats + kFloats / 8, [&] { sk::topk_abs_mask(d.x, kSparseK, words); },
      "bytes = 1 read of x + mask");
  state.counters["speedup_vs_nth_element"] = g_refs.nth_element_seconds / seconds;
}

// The compressors of the comparison baselines, one whole compression per iteration.
// random-k with a shared seed: the draw (written once, read by the two-pass select) and the
// compaction of the gradient's values on the 1% mask.
void BM_randk_compress(benchmark::State& state) {
  BenchData& d = data();
  std::vector<float> draw(kN);
  std::vector<std::uint32_t> idx(kSparseK);
  std::uint64_t step = 0;
  run_kernel(
      state, "compress randk 1%", 4.0 * kFloats + 8.0 * kFloats + 12.0 * kSparse,
      [&] {
        sk::random_statistic(++step, 0, draw);
        sk::topk_abs_indices(draw, kSparseK, idx);
        sk::compact(d.x, idx, d.packed);
      },
      "draw written, read twice; compact");
}

// 1-bit Adam, chunk 2048: the chunk norms (one read), the sign pass (read and write x, write
// the bits) and the decompression into an accumulator (read bits, read and write acc).
void BM_onebit_compress(benchmark::State& state) {
  BenchData& d = data();
  constexpr std::size_t kChunk = 2048;
  std::vector<float> x = d.x, acc(kN, 0.0f);
  std::vector<double> partial(kN / kChunk);
  std::vector<float> scales(kN / kChunk);
  std::vector<std::uint64_t> words(sk::words_for(kN));
  run_kernel(
      state, "compress 1-bit + expand", 4.0 * kFloats + 8.0 * kFloats + kFloats / 8 + kFloats / 8 + 8.0 * kFloats,
      [&] {
        sk::block_sum_squares(x, kChunk, partial);
        for (std::size_t c = 0; c < scales.size(); ++c) scales[c] = static_cast<float>(std::sqrt(partial[c] / kChunk));
        sk::sign_compress(x, kChunk, scales, words);
        sk::sign_expand_add(words, kChunk, scales, acc);
      },
      "norms, signs (error kept), expansion");
}

// PowerSGD at rank 4 on a 4096 x 4096 matrix (2^24 entries): P = M Q, Gram-Schmidt, Q = M^T P
// and the residual pass (P Q^T written, M read and written); counted bytes are the passes over
// M (three reads, one write, the approximation written), the factors being tiny. Compute-bound
// at r = 4 (2 r flops per entry and pass), so the fraction of the triad is below the others.
void BM_powersgd_compress(benchmark::State& state) {
  BenchData& d = data();
  constexpr std::size_t kRows = 4096, kCols = kN / kRows, kRank = 4;
  std::vector<float> m = d.x, approx(kN), p(kRows * kRank), q(kCols * kRank, 0.5f);
  run_kernel(
      state, "compress PowerSGD r4", 4.0 * kFloats * 3 + 4.0 * kFloats + 4.0 * kFloats,
      [&] {
        sk::lowrank_project(m, kRows, kCols, q, p);
        sk::orthonormalize_columns(p, kRows);
        sk::lowrank_project_t(m, kRows, kCols, p, q);
        sk::lowrank_residual(m, kRows, kCols, p, q, approx);
      },
      "M Q, Gram-Schmidt, M^T P, M -= P Q^T");
}

// DeMo, chunk 64, top 4: the forward DCT of the momentum, the per-chunk top-k, the extracted
// part expanded and inverted (the decompression every worker also runs on the mean); counted
// bytes: the transform reads and writes (twice), the top-k reads the coefficients, the
// expansion clears and scatters. Compute-bound: 64 multiply-adds per entry and transform.
void BM_demo_compress(benchmark::State& state) {
  BenchData& d = data();
  constexpr std::size_t kChunk = 64, kTop = 4;
  std::vector<float> basis(kChunk * kChunk);
  for (std::size_t f = 0; f < kChunk; ++f) {
    for (std::size_t j = 0; j < kChunk; ++j) {
      basis[f * kChunk + j] = static_cast<float>(std::sqrt((f == 0 ? 1.0 : 2.0) / kChunk) *
                                                 std::cos(M_PI * static_cast<double>(2 * j + 1) * f / (2.0 * kChunk)));
    }
  }
  std::vector<float> coeffs(kN), back(kN), values(kN / kChunk * kTop);
  std::vector<std::uint32_t> idx(kN / kChunk * kTop);
  run_kernel(
      state, "compress DeMo c64 k4", 8.0 * kFloats + 4.0 * kFloats + 4.0 * kFloats + 8.0 * kFloats,
      [&] {
        sk::chunk_transform(d.x, kChunk, basis, false, coeffs);
        sk::chunk_topk(coeffs, kChunk, kTop, idx, values);
        sk::fill(coeffs, 0.0f);
        sk::expand(values, idx, coeffs);
        sk::chunk_transform(coeffs, kChunk, basis, true, back);
      },
      "DCT, top-k per chunk, expand, IDCT");
}

void BM_nth_element(benchmark::State& state) {
  BenchData& d = data();
  std::vector<float> scratch(kN);
  run_kernel(
      state, "nth_element (abs copy)", 8.0 * kFloats, [&] { nth_element_once(d.x, scratch); },
      "single-threaded std::nth_element");
}

// Every kernel benchmark, in run order, under BENCHMARK's names (the function names).
void register_benchmarks() {
  using Benchmark = void (*)(benchmark::State&);
  const std::pair<const char*, Benchmark> benchmarks[] = {{"BM_triad", BM_triad},
                                                          {"BM_adams_step", BM_adams_step},
                                                          {"BM_adamw_step", BM_adamw_step},
                                                          {"BM_adams_step_masked", BM_adams_step_masked},
                                                          {"BM_pack_bits", BM_pack_bits},
                                                          {"BM_popcount", BM_popcount},
                                                          {"BM_bits_to_indices", BM_bits_to_indices},
                                                          {"BM_compact", BM_compact},
                                                          {"BM_expand", BM_expand},
                                                          {"BM_accumulate", BM_accumulate},
                                                          {"BM_topk_abs_mask", BM_topk_abs_mask},
                                                          {"BM_nth_element", BM_nth_element},
                                                          {"BM_randk_compress", BM_randk_compress},
                                                          {"BM_onebit_compress", BM_onebit_compress},
                                                          {"BM_powersgd_compress", BM_powersgd_compress},
                                                          {"BM_demo_compress", BM_demo_compress}};
  for (const auto& [name, run] : benchmarks) {
    benchmark::RegisterBenchmark(name, run)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
}

void measure_references() {
  g_refs.triad_gbps = measure_triad_gbps();
  const BenchData& d = data();
  std::vector<float> scratch(kN);
  g_refs.nth_element_seconds = 1e30;
  for (int r = 0; r < 3; ++r) {
    g_refs.nth_element_seconds = std::min(g_refs.nth_element_seconds, nth_element_once(d.x, scratch));
  }
  std::printf("reference: STREAM triad %.2f GB/s (best of %d, %d threads); nth_element on 2^24 |x|: %.1f ms\n",
              g_refs.triad_gbps, kReferenceRepeats, omp_get_max_threads(), 1e3 * g_refs.nth_element_seconds);
}

// The table divides by the best triad seen (startup or BM_triad), so a triad slowed by a
// neighbour cannot inflate the fractions. Kernels that read what they write (accumulate, the
// Adam steps) may exceed 100%: the triad's store also costs a write-allocate read, which
// STREAM does not count.
void print_summary() {
  const double triad = std::max(g_refs.triad_gbps, summary_row("triad").gbps);
  std::printf("\nBest repetition per kernel (run with --benchmark_repetitions=N on a shared machine)\n");
  std::printf("%-24s %10s %10s  %s\n", "kernel", "GB/s", "of triad", "note");
  for (const auto& [name, row] : g_summary) {
    std::printf("%-24s %10.2f %9.0f%%  %s\n", name.c_str(), row.gbps, 100.0 * row.gbps / triad, row.note.c_str());
  }
  const SummaryRow& topk = summary_row(kTopkRow);
  if (topk.seconds_per_iteration > 0.0) {
    std::printf("top-k 1%% of 2^24: %.1f ms, %.1fx faster than std::nth_element (%.1f ms at startup)\n",
                1e3 * topk.seconds_per_iteration, g_refs.nth_element_seconds / topk.seconds_per_iteration,
                1e3 * g_refs.nth_element_seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  measure_references();
  benchmark::RunSpecifiedBenchmarks();
  print_summary();
  benchmark::Shutdown();
  return 0;
}
