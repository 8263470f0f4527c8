// The GPT model learns: it overfits one batch, reaches the entropy-rate floor of the synthetic
// Markov corpus, and learns tinyshakespeare bytes (model/gpt.hpp, model/data.hpp). A plain AdamW
// lives here so these tests do not depend on the optimizer core.
#include <doctest/doctest.h>
#include <omp.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <numbers>
#include <string>
#include <vector>

#include "model/data.hpp"
#include "model/gpt.hpp"
#include "util/rng.hpp"

using namespace scape::model;

namespace {

// AdamW (Loshchilov & Hutter 2019) with decoupled decay on the tensors the layout marks.
struct AdamW {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  std::vector<float> m, v;
  int t = 0;

  void step(std::vector<float>& p, const std::vector<float>& g, const scape::ParamLayout& layout, float lr) {
    if (m.empty()) {
      m.assign(p.size(), 0.0f);
      v.assign(p.size(), 0.0f);
    }
    ++t;
    const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t));
    const float c2 = 1.0f - std::pow(beta2, static_cast<float>(t));
    for (const auto& slot : layout.slots()) {
      const float decay = slot.decay ? lr * weight_decay : 0.0f;
      for (std::size_t i = slot.offset; i < slot.end(); ++i) {
        m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
        v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
        p[i] -= decay * p[i] + lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      }
    }
  }
};

// Linear warmup over the first 10% of steps, then cosine decay to lr / 10.
float schedule(int step, int steps, float lr) {
  const int warm = std::max(1, steps / 10);
  if (step < warm) return lr * static_cast<float>(step + 1) / static_cast<float>(warm);
  const double progress = static_cast<double>(step - warm) / std::max(1, steps - warm);
  return lr * static_cast<float>(0.1 + 0.45 * (1.0 + std::cos(std::numbers::pi * progress)));
}

struct Trainer {
  Gpt model;
  std::vector<float> params, grads;
  int B, T;
  std::vector<std::int32_t> in, tg;

  Trainer(const GptConfig& cfg, int batch, std::uint64_t seed)
      : model(cfg), params(model.num_params()), grads(model.num_params()), B(batch), T(cfg.block_size),
        in(static_cast<std::size_t>(batch) * cfg.block_size), tg(in.size()) {
    model.init_params(params, seed);
  }

  void train(const BatchSampler& sampler, int steps, float lr) {
    AdamW opt;
    for (int s = 0; s < steps; ++s) {
      sampler.worker_batch(static_cast<std::uint64_t>(s), B, 1, 0, in, tg);
      model.forward_backward(params, in, tg, B, T, grads);
      opt.step(params, grads, model.layout(), schedule(s, steps, lr));
    }
  }

  // Mean loss over `batches` fixed validation batches (steps 0..batches-1 of the val sampler).
  double evaluate(const BatchSampler& sampler, int batches) {
    double total = 0;
    for (int k = 0; k < batches; ++k) {
      sampler.worker_batch(static_cast<std::uint64_t>(k), B, 1, 0, in, tg);
      total += model.loss(params, in, tg, B, T);
    }
    return total / batches;
  }
};

// One thread per test process: ctest runs these executables side by side on CI's two cores, and
// OpenMP teams that oversubscribe busy cores slow down several-fold at every barrier. One thread
// is also the configuration the simulator's workers use.
struct SingleThread {
  int saved = omp_get_max_threads();
  SingleThread() { omp_set_num_threads(1); }
  ~SingleThread() { omp_set_num_threads(saved); }
};

// The learning-curve tests need optimised Eigen: a Debug (and sanitizer) build runs them over 100x
// slower, so they are skipped there; the gradient check and the overfit test still run.
#ifdef NDEBUG
constexpr bool kUnoptimised = false;
#else
constexpr bool kUnoptimised = true;
#endif

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("overfitting one fixed batch drives the loss below 0.1") {
  SingleThread one;
  const GptConfig cfg{.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 64};
  Trainer tr(cfg, 4, 1);
  for (std::size_t i = 0; i < tr.in.size(); ++i) {
    tr.in[i] = static_cast<std::int32_t>(scape::rng::derive(11, i) % 64);
    tr.tg[i] = static_cast<std::int32_t>(scape::rng::derive(12, i) % 64);
  }
  AdamW opt;
  opt.weight_decay = 0.0f;  // memorisation, not generalisation
  const float first = tr.model.forward_backward(tr.params, tr.in, tr.tg, tr.B, tr.T, tr.grads);
  float last = first;
  int steps = 0;
  for (; steps < 400 && last >= 0.1f; ++steps) {
    opt.step(tr.params, tr.grads, tr.model.layout(), 1e-2f);
    last = tr.model.forward_backward(tr.params, tr.in, tr.tg, tr.B, tr.T, tr.grads);
  }
  MESSAGE("overfit: loss ", first, " -> ", last, " in ", steps, " steps");
  CHECK(first == doctest::Approx(std::log(64.0)).epsilon(0.02));
  CHECK(last < 0.1f);
}

TEST_CASE("training on the synthetic Markov corpus approaches its entropy rate" * doctest::skip(kUnoptimised)) {
  SingleThread one;
  const MarkovConfig mc{.vocab_size = 64, .successors = 4, .concentration = 0.9, .seed = 5};
  const MarkovSource source(mc);
  const TokenSplit data = synthetic_corpus(mc, 200000, 0.1);
  // n_embd = 64 = vocab: the tied head then has the rank to express the 64x64 log-transition matrix.
  const GptConfig cfg{.n_layer = 1, .n_head = 2, .n_embd = 64, .block_size = 16, .vocab_size = 64};
  Trainer tr(cfg, 32, 1);
  const BatchSampler train(data.train, cfg.block_size, 1, Split::kTrain);
  const BatchSampler val(data.val, cfg.block_size, 1, Split::kVal);

  const auto t0 = std::chrono::steady_clock::now();
  tr.train(train, 600, 1e-2f);
  const double loss = tr.evaluate(val, 16);

  // The oracle (the true transition law) on the very same validation tokens: comparing against
  // it removes the sampling noise of the 16k-token estimate.
  double oracle = 0;
  for (int k = 0; k < 16; ++k) {
    val.worker_batch(static_cast<std::uint64_t>(k), tr.B, 1, 0, tr.in, tr.tg);
    for (std::size_t i = 0; i < tr.in.size(); ++i) oracle -= std::log(source.probability(tr.in[i], tr.tg[i]));
  }
  oracle /= 16.0 * static_cast<double>(tr.in.size());
  MESSAGE("synthetic: entropy rate ", source.entropy_rate(), ", oracle on val ", oracle, ", model ", loss,
          ", gap to oracle ", loss - oracle, " (", seconds_since(t0), " s)");
  // Measured: H = 1.904 nats, oracle 1.907 on these tokens, model 1.931 after 600 steps (4.18 at
  // init): 0.024 above the oracle; seeds 2-4 give 0.029-0.031. The bound leaves ~2x margin.
  CHECK(oracle == doctest::Approx(source.entropy_rate()).epsilon(0.02));
  CHECK(loss - oracle < 0.06);
  CHECK(loss - oracle > -0.02);  // no model beats the true law by more than noise
}

TEST_CASE("training on tinyshakespeare bytes lowers validation loss well below ln(256)" *
          doctest::skip(kUnoptimised)) {
  const char* root = std::getenv("SCAPE_SOURCE_DIR");
  const std::filesystem::path file =
      std::filesystem::path(root != nullptr ? root : ".") / ".." / "shared" / "data" / "tinyshakespeare.txt";
  if (root == nullptr || !std::filesystem::is_regular_file(file)) {
    MESSAGE("SKIPPED: tinyshakespeare not found at ", file.string(),
            " (set SCAPE_SOURCE_DIR to the repo; the file lives in ../shared/data)");
    return;
  }
  SingleThread one;
  const TokenSplit data = load_text_bytes(file.string(), 0.1);
  // Unigram entropy of the training bytes: the best loss without any use of context.
  std::array<double, 256> counts{};
  for (auto t : data.train) counts[t] += 1;
  double unigram = 0;
  for (double c : counts) {
    const double p = c / static_cast<double>(data.train.size());
    if (p > 0) unigram -= p * std::log(p);
  }

  const GptConfig cfg{.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 64, .vocab_size = 256};
  Trainer tr(cfg, 16, 1);
  const BatchSampler train(data.train, cfg.block_size, 1, Split::kTrain);
  const BatchSampler val(data.val, cfg.block_size, 1, Split::kVal);
  const double before = tr.evaluate(val, 8);
  const auto t0 = std::chrono::steady_clock::now();
  tr.train(train, 400, 5e-3f);
  const double after = tr.evaluate(val, 8);
  MESSAGE("tinyshakespeare: val loss ", before, " -> ", after, " (unigram entropy ", unigram, ", ln 256 = ",
          std::log(256.0), ") in ", seconds_since(t0), " s");
  CHECK(before == doctest::Approx(std::log(256.0)).epsilon(0.02));
  // Measured: 5.541 -> 2.34 after 400 steps; other seeds (init and batches) give 2.47-2.61, so
  // the bound leaves ~0.3 over the worst seed. It also sits 0.4 below the unigram entropy (3.31):
  // the model must use context, not just byte frequencies.
  CHECK(after < 2.9);
  CHECK(after < unigram - 0.4);
}

TEST_CASE("bf16 precision: loss and gradients within bf16 rounding of fp32; training follows fp32") {
  SingleThread one;
  GptConfig cfg{.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 64};
  Trainer fp32(cfg, 4, 7);
  cfg.precision = Precision::bf16;
  Trainer bf16(cfg, 4, 7);
  REQUIRE(bf16.params == fp32.params);
  for (std::size_t i = 0; i < fp32.in.size(); ++i) {
    fp32.in[i] = bf16.in[i] = static_cast<std::int32_t>(scape::rng::derive(31, i) % 64);
    fp32.tg[i] = bf16.tg[i] = static_cast<std::int32_t>(scape::rng::derive(32, i) % 64);
  }
  // One forward/backward on the same parameters: bf16 keeps 8 significant bits (relative
  // rounding 2^-9 = 0.2% per operand), so the loss moves by well under 1% and each tensor's
  // gradient by a few percent; an op that ignored the precision would give identical results.
  const float loss32 = fp32.model.forward_backward(fp32.params, fp32.in, fp32.tg, 4, 16, fp32.grads);
  const float loss16 = bf16.model.forward_backward(bf16.params, bf16.in, bf16.tg, 4, 16, bf16.grads);
  CHECK(loss16 != loss32);
  CHECK(loss16 == doctest::Approx(loss32).epsilon(5e-3));
  for (const auto& slot : fp32.model.layout().slots()) {
    double diff = 0, norm = 0;
    for (std::size_t i = slot.offset; i < slot.end(); ++i) {
      diff += double(bf16.grads[i] - fp32.grads[i]) * (bf16.grads[i] - fp32.grads[i]);
      norm += double(fp32.grads[i]) * fp32.grads[i];
    }
    INFO("tensor ", slot.name, ": relative L2 difference ", std::sqrt(diff / norm));
    CHECK(std::sqrt(diff / norm) < 0.05);
  }
  // 60 steps of AdamW on one fixed batch: bf16 follows the fp32 curve within 2% of its loss.
  AdamW opt32, opt16;
  for (int s = 0; s < 60; ++s) {
    opt32.step(fp32.params, fp32.grads, fp32.model.layout(), 3e-3f);
    opt16.step(bf16.params, bf16.grads, bf16.model.layout(), 3e-3f);
    const float l32 = fp32.model.forward_backward(fp32.params, fp32.in, fp32.tg, 4, 16, fp32.grads);
    const float l16 = bf16.model.forward_backward(bf16.params, bf16.in, bf16.tg, 4, 16, bf16.grads);
    INFO("step ", s + 1, ": fp32 ", l32, ", bf16 ", l16);
    CHECK(l16 == doctest::Approx(l32).epsilon(0.02));
    if (s == 59) CHECK(l32 < loss32 - 1.0f);  // the curve being followed is a real descent
  }
}
