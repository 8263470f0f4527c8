// GPT forward+backward throughput at ~0.2M, ~1M and ~10M parameters, as tokens/s and as a
// fraction of the best SGEMM this machine runs: a 1024^3 Eigen GEMM built for the host ISA (the
// same flags as the model, cmake/isa.cmake), measured in the same run at the same thread count,
// at 1 thread (a simulator worker) and all cores. A second column gives the fraction of the
// GEMMs of the model's largest layer (MLP up-projection, forward and backward products) at the
// model's own shapes, which separates the cost of small shapes from the model's other work.
// Model FLOPs: scape::model::train_flops_per_token (6 per matmul weight plus causal attention).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <Eigen/Dense>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt.hpp"
#include "util/rng.hpp"

namespace {

using scape::model::Gpt;
using scape::model::GptConfig;

// A benchmarked shape: its row name, the model and the sequences of one step.
struct Size {
  const char* name;
  GptConfig cfg;
  int batch;  // sequences per step
};

// Byte-level vocabulary throughout; 10M is nanoGPT's shakespeare_char architecture.
const Size kSizes[] = {
    {"0.2M", {.n_layer = 4, .n_head = 4, .n_embd = 64, .block_size = 64, .vocab_size = 256}, 16},
    {"1M", {.n_layer = 5, .n_head = 4, .n_embd = 128, .block_size = 128, .vocab_size = 256}, 16},
    {"10M", {.n_layer = 6, .n_head = 6, .n_embd = 384, .block_size = 256, .vocab_size = 256}, 4},
};

struct Row {
  double params = 0, tokens_per_s = 0, model_flops = 0, gemm_flops = 0, peak_flops = 0;
};
// Filled as the benchmarks run and printed by main(); keyed by (size index, threads).
std::map<std::pair<int, int>, Row> g_rows;

// Arg 1 is the thread count; 0 means every core (the single-worker configuration).
int apply_threads(std::int64_t arg) {
  const int threads = arg == 0 ? omp_get_num_procs() : static_cast<int>(arg);
  omp_set_num_threads(threads);
  return threads;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The reference: the three products of the MLP up-projection, the model's largest layer, at
// the same N = B T: y = x w^T (forward), dx = dy w and dw = dy^T x (backward).
struct Gemm {
  RowMajor x, w, y, dy, dx, dw;
  explicit Gemm(const Size& z)
      : x(RowMajor::Random(static_cast<Eigen::Index>(z.batch) * z.cfg.block_size, z.cfg.n_embd)),
        w(RowMajor::Random(4 * z.cfg.n_embd, z.cfg.n_embd)),
        y(x.rows(), w.rows()),
        dy(RowMajor::Random(x.rows(), w.rows())),
        dx(x.rows(), x.cols()),
        dw(w.rows(), w.cols()) {}
  double flops() const { return 3 * 2.0 * static_cast<double>(x.rows() * x.cols() * w.rows()); }
  void run() {
    y.noalias() = x * w.transpose();
    dx.noalias() = dy * w;
    dw.noalias() = dy.transpose() * x;
  }
  const float* out() const { return y.data(); }
};

// The machine's reference: a square SGEMM large enough to reach Eigen's peak on these cores.
struct PeakGemm {
  static constexpr Eigen::Index kSize = 1024;
  RowMajor a = RowMajor::Random(kSize, kSize), b = RowMajor::Random(kSize, kSize), c{kSize, kSize};
  double flops() const { return 2.0 * static_cast<double>(kSize * kSize * kSize); }
  void run() { c.noalias() = a * b; }
  const float* out() const { return c.data(); }
};

// FLOP/s of `g` over at least `seconds` of repeated runs.
template <class G>
double rate_of(G& g, double seconds) {
  g.run();
  long iters = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {
    g.run();
    benchmark::DoNotOptimize(g.out());
    ++iters;
  } while (seconds_since(t0) < seconds);
  return g.flops() * static_cast<double>(iters) / seconds_since(t0);
}

double gemm_rate(const Size& z, double seconds) {
  Gemm g(z);
  return rate_of(g, seconds);
}

double peak_rate(double seconds) {
  PeakGemm g;
  return rate_of(g, seconds);
}

void BM_ForwardBackward(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0));
  const int threads = apply_threads(state.range(1));
  const Size& z = kSizes[s];
  const int B = z.batch, T = z.cfg.block_size;
  Gpt model(z.cfg);
  std::vector<float> params(model.num_params()), grads(model.num_params());
  model.init_params(params, 1);
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<std::int32_t>(scape::rng::derive(1, i) % 256);
    tg[i] = static_cast<std::int32_t>(scape::rng::derive(2, i) % 256);
  }
  model.forward_backward(params, in, tg, B, T, grads);  // allocates the workspace

  // The references bracket the model's timing, so all see the same machine load.
  const double peak_before = peak_rate(0.5);
  const double gemm_before = gemm_rate(z, 0.5);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.forward_backward(params, in, tg, B, T, grads));
  }
  const double elapsed = seconds_since(t0);
  const double gemm = 0.5 * (gemm_before + gemm_rate(z, 0.5));
  const double peak = 0.5 * (peak_before + peak_rate(0.5));

  const double tokens = static_cast<double>(B) * T;
  const double flops = tokens * scape::model::train_flops_per_token(scape::model::transformer_shape(z.cfg), T);
  const auto iters = static_cast<double>(state.iterations());
  Row& row = g_rows[{s, threads}];
  row.params = static_cast<double>(model.num_params());
  row.tokens_per_s = tokens * iters / elapsed;
  row.model_flops = flops * iters / elapsed;
  row.gemm_flops = gemm;
  row.peak_flops = peak;
  state.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_SGEMM_FLOP/s"] = peak;
  state.counters["peak_frac"] = row.model_flops / peak;
  state.counters["layer_gemm_frac"] = row.model_flops / gemm;
  state.SetLabel(std::string(z.name) + " threads=" + std::to_string(threads));
}

void print_table() {
  std::printf("\n%-5s %9s %11s %7s %10s %10s %10s %10s %9s %9s\n", "size", "params", "B x T", "threads",
              "tokens/s", "model GF/s", "peak GF/s", "layer GF/s", "of peak", "of layer");
  for (const auto& [key, row] : g_rows) {
    if (row.tokens_per_s == 0) continue;
    const Size& z = kSizes[key.first];
    std::printf("%-5s %9.0f %4d x %-4d %7d %10.0f %10.2f %10.2f %10.2f %8.1f%% %8.1f%%\n", z.name, row.params,
                z.batch, z.cfg.block_size, key.second, row.tokens_per_s, row.model_flops / 1e9,
                row.peak_flops / 1e9, row.gemm_flops / 1e9, 100.0 * row.model_flops / row.peak_flops,
                100.0 * row.model_flops / row.gemm_flops);
  }
  std::printf("peak: a %ld^3 Eigen SGEMM built for this build's ISA, measured around each row\n",
              static_cast<long>(PeakGemm::kSize));
}

}  // namespace

// 1 s minimum per figure to average out the noise of shared machines.
BENCHMARK(BM_ForwardBackward)
    ->ArgsProduct({{0, 1, 2}, {1, 0}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  print_table();
  benchmark::Shutdown();
  return 0;
}
