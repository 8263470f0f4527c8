// GPT model properties: layout and weight-decay flags, config validation, GPT-2 init, loss at
// init, input checks, determinism, and W instances running concurrently (model/gpt.hpp).
#include <doctest/doctest.h>
#include <omp.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/gpt.hpp"
#include "model/language_model.hpp"
#include "util/rng.hpp"

using namespace scape::model;

namespace {

constexpr GptConfig kSmall{.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 32, .vocab_size = 96};

std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  std::vector<std::int32_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<std::int32_t>(scape::rng::derive(seed, i) % static_cast<std::uint64_t>(vocab));
  }
  return out;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Result {
  float loss;
  std::vector<float> grads;
};

Result run(Gpt& model, const std::vector<float>& params, std::uint64_t data_seed, int B, int T) {
  const auto in = random_tokens(static_cast<std::size_t>(B) * T, model.config().vocab_size, data_seed);
  const auto tg = random_tokens(in.size(), model.config().vocab_size, data_seed + 1);
  Result r{0, std::vector<float>(model.num_params())};
  r.loss = model.forward_backward(params, in, tg, B, T, r.grads);
  return r;
}

double stddev(const float* p, std::size_t n) {
  double s = 0, s2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    s += p[i];
    s2 += static_cast<double>(p[i]) * p[i];
  }
  const double mean = s / static_cast<double>(n);
  return std::sqrt(s2 / static_cast<double>(n) - mean * mean);
}

}  // namespace

TEST_CASE("layout: GPT-2 tensors in order, nanoGPT weight-decay flags, parameter count") {
  const scape::ParamLayout layout = transformer_layout(transformer_shape(kSmall));
  const std::size_t C = 32, V = 96, T = 32, L = 2;
  CHECK(layout.size() == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
  const auto& s = layout.slots();
  REQUIRE(s.size() == 2 + 12 * L + 2);
  CHECK(s.front().name == "wte");
  CHECK(s[1].name == "wpe");
  CHECK(s[2].name == "h.0.attn_norm.w");
  CHECK(s.back().name == "norm.bias");
  CHECK(layout.slot("h.1.attn.qkv.w").shape == std::vector<std::size_t>{3 * C, C});
  CHECK(layout.slot("h.1.mlp.proj.w").shape == std::vector<std::size_t>{C, 4 * C});
  for (const auto& slot : s) {
    // Matrices inside the blocks decay; embeddings, biases and LayerNorm parameters do not.
    const bool matrix = slot.shape.size() == 2 && slot.name != "wte" && slot.name != "wpe";
    INFO(slot.name);
    CHECK(slot.decay == matrix);
  }
}

TEST_CASE("config validation names the offending field") {
  auto message = [](GptConfig cfg) {
    try {
      cfg.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  GptConfig c = kSmall;
  c.n_layer = 0;
  CHECK(message(c).find("n_layer") != std::string::npos);
  c = kSmall;
  c.vocab_size = -3;
  CHECK(message(c).find("vocab_size") != std::string::npos);
  c = kSmall;
  c.n_head = 5;  // 32 is not a multiple of 5
  CHECK(message(c).find("n_embd") != std::string::npos);
  c = kSmall;
  c.block_size = 0;
  CHECK(message(c).find("block_size") != std::string::npos);
  CHECK_THROWS_AS(Gpt{c}, std::invalid_argument);
  CHECK(message(kSmall) == "no exception");
}

TEST_CASE("GPT-2 init: N(0, 0.02), residual projections scaled, LayerNorm 1, biases 0, seeded") {
  const GptConfig cfg{.n_layer = 4, .n_head = 4, .n_embd = 64, .block_size = 64, .vocab_size = 256};
  Gpt model(cfg);
  std::vector<float> a(model.num_params()), b(a.size()), c(a.size());
  model.init_params(a, 42);
  model.init_params(b, 42);
  model.init_params(c, 43);
  CHECK(bit_identical(a, b));
  CHECK(!bit_identical(a, c));

  const double residual = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  for (const auto& slot : model.layout().slots()) {
    const float* p = a.data() + slot.offset;
    INFO(slot.name);
    if (slot.name.ends_with(".bias")) {
      for (std::size_t i = 0; i < slot.numel(); ++i) CHECK(p[i] == 0.0f);
    } else if (slot.shape.size() == 1) {
      for (std::size_t i = 0; i < slot.numel(); ++i) CHECK(p[i] == 1.0f);
    } else {
      // >= 4096 samples: the sample std is within ~2% of the true one (5% allowed).
      const bool scaled = slot.name.ends_with("proj.w");
      CHECK(stddev(p, slot.numel()) == doctest::Approx(scaled ? residual : 0.02).epsilon(0.05));
    }
  }

  // The double model draws the same values, rounded once to float.
  GptDouble ref(cfg);
  std::vector<double> d(ref.num_params());
  ref.init_params(d, 42);
  for (std::size_t i = 0; i < d.size(); i += 97) CHECK(static_cast<float>(d[i]) == a[i]);
}

TEST_CASE("loss at initialisation is within 0.1 of ln(vocab_size)") {
  for (int vocab : {256, 50257}) {
    const GptConfig cfg{.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 64, .vocab_size = vocab};
    Gpt model(cfg);
    std::vector<float> params(model.num_params());
    model.init_params(params, 1);
    const int B = 4, T = 64;
    const auto in = random_tokens(B * T, vocab, 5), tg = random_tokens(B * T, vocab, 6);
    const float loss = model.loss(params, in, tg, B, T);
    MESSAGE("vocab ", vocab, ": loss at init ", loss, ", ln V = ", std::log(vocab));
    CHECK(std::abs(loss - std::log(static_cast<float>(vocab))) < 0.1f);
  }
}

TEST_CASE("calls are checked: shapes, T <= block_size, token range") {
  Gpt model(kSmall);
  std::vector<float> params(model.num_params()), grads(model.num_params());
  model.init_params(params, 1);
  auto in = random_tokens(2 * 8, 96, 1), tg = random_tokens(2 * 8, 96, 2);
  CHECK_NOTHROW(model.forward_backward(params, in, tg, 2, 8, grads));
  CHECK_THROWS_AS(model.forward_backward(params, in, tg, 4, 8, grads), std::invalid_argument);
  CHECK_THROWS_AS(model.loss(params, random_tokens(2 * 33, 96, 1), random_tokens(2 * 33, 96, 2), 2, 33),
                  std::invalid_argument);
  std::vector<float> short_params(params.size() - 1);
  CHECK_THROWS_AS(model.loss(short_params, in, tg, 2, 8), std::invalid_argument);
  in[5] = 96;
  CHECK_THROWS_AS(model.loss(params, in, tg, 2, 8), std::out_of_range);
  in[5] = 0;
  tg[0] = -1;
  CHECK_THROWS_AS(model.loss(params, in, tg, 2, 8), std::out_of_range);
}

TEST_CASE("determinism: same seed gives bit-identical params, loss and grads, across shapes and instances") {
  Gpt first(kSmall), second(kSmall);
  std::vector<float> p1(first.num_params()), p2(second.num_params());
  first.init_params(p1, 9);
  second.init_params(p2, 9);
  REQUIRE(bit_identical(p1, p2));

  const Result a = run(first, p1, 100, 4, 32);
  // Other shapes in between reshape the workspace; a stale activation would change the result.
  run(first, p1, 200, 2, 7);
  run(first, p1, 300, 8, 32);
  const Result b = run(first, p1, 100, 4, 32);
  const Result c = run(second, p2, 100, 4, 32);
  CHECK(a.loss == b.loss);
  CHECK(a.loss == c.loss);
  CHECK(bit_identical(a.grads, b.grads));
  CHECK(bit_identical(a.grads, c.grads));
  // A single token sequence (T = 1) is a valid, if degenerate, call.
  CHECK(std::isfinite(run(first, p1, 400, 3, 1).loss));
}

TEST_CASE("W single-threaded instances in W std::threads match the same work done serially") {
  constexpr int W = 3;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Gpt reference(kSmall);
  std::vector<float> params(reference.num_params());
  reference.init_params(params, 3);
  std::vector<Result> serial;
  for (int w = 0; w < W; ++w) serial.push_back(run(reference, params, 1000 + static_cast<std::uint64_t>(w), 4, 32));
  omp_set_num_threads(saved);

  std::vector<Result> threaded(W);
  std::vector<int> eigen_threads(W);
  std::vector<std::thread> pool;
  for (int w = 0; w < W; ++w) {
    pool.emplace_back([&, w] {
      omp_set_num_threads(1);  // what each simulator worker does
      eigen_threads[static_cast<std::size_t>(w)] = Eigen::nbThreads();
      Gpt model(kSmall);
      for (int rep = 0; rep < 3; ++rep) {
        threaded[static_cast<std::size_t>(w)] = run(model, params, 1000 + static_cast<std::uint64_t>(w), 4, 32);
      }
    });
  }
  for (auto& t : pool) t.join();
  for (int w = 0; w < W; ++w) {
    const auto i = static_cast<std::size_t>(w);
    CHECK(eigen_threads[i] == 1);  // Eigen follows the calling thread's OpenMP setting
    CHECK(threaded[i].loss == serial[i].loss);
    CHECK(bit_identical(threaded[i].grads, serial[i].grads));
  }
}

TEST_CASE("backward: each gradient range is reported once final, the ranges tile [0, N) in backward order") {
  // overlap_grad_reduce reduces a range as soon as the hook reports it, so a range reported
  // before its last write would send a partial gradient.
  LanguageModelSpec gpt;
  gpt.gpt = kSmall;
  LanguageModelSpec llama;
  llama.type = "llama";
  llama.llama = LlamaConfig{.n_layer = 3, .n_head = 4, .n_kv_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 50};
  for (const LanguageModelSpec& spec : {gpt, llama}) {
    CAPTURE(spec.type);
    const auto model = spec.make();
    const scape::ParamLayout& layout = model->layout();
    const std::size_t n = layout.size();
    std::vector<float> params(n), plain(n), hooked(n);
    model->init_params(params, 5);
    const int B = 2, T = spec.block_size();
    const auto in = random_tokens(static_cast<std::size_t>(B) * T, spec.vocab_size(), 11);
    const auto tg = random_tokens(in.size(), spec.vocab_size(), 12);
    const double loss = model->forward_backward(params, in, tg, B, T, plain);
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    std::vector<std::vector<float>> at_report;
    const double hooked_loss = model->forward_backward(params, in, tg, B, T, hooked, [&](std::size_t b, std::size_t e) {
      ranges.emplace_back(b, e);
      at_report.emplace_back(hooked.begin() + static_cast<std::ptrdiff_t>(b), hooked.begin() + static_cast<std::ptrdiff_t>(e));
    });
    CHECK(hooked_loss == loss);
    CHECK(bit_identical(hooked, plain));
    const int layers = spec.type == "llama" ? spec.llama.n_layer : spec.gpt.n_layer;
    REQUIRE(ranges.size() == static_cast<std::size_t>(layers) + 2);
    // The final norm (and a Llama's head) first, then the blocks from last to first, each range
    // ending where the one before began; the embeddings last, from index 0.
    CHECK(ranges.front().second == n);
    for (std::size_t i = 1; i < ranges.size(); ++i) CHECK(ranges[i].second == ranges[i - 1].first);
    CHECK(ranges.back().first == 0);
    const std::size_t first_block = spec.type == "llama" ? 1 : 2;  // after wte (and a GPT's wpe)
    CHECK(ranges.back().second == layout.slots()[first_block].offset);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      CAPTURE(i);
      const std::vector<float> final_values(plain.begin() + static_cast<std::ptrdiff_t>(ranges[i].first),
                                            plain.begin() + static_cast<std::ptrdiff_t>(ranges[i].second));
      CHECK(bit_identical(at_report[i], final_values));
    }
  }
}
