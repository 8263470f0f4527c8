// Coded masks (optimizers/scape/mask_codec.*, optimizers/scape/mask_exchange.*): shard messages round trip in every
// encoding with the sizes of their closed forms, auto picks the smallest format, and SCAPE
// trains bit-identically with every encoding while its ledger counts exactly the coded bytes
// (Elias-Fano through step_collectives; delta and auto from the masks of the run).
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "optimizers/scape/mask_codec.hpp"
#include "optimizers/volume.hpp"
#include "quadratic_run.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using scape::testing::mixed_layout;
using scape::testing::run_quadratic;

namespace {

using Words = std::vector<std::uint64_t>;
constexpr MaskEncoding kEncodings[] = {MaskEncoding::bitmap, MaskEncoding::elias_fano, MaskEncoding::delta,
                                       MaskEncoding::auto_select};

Words random_mask(std::size_t n, double density, std::uint32_t seed) {
  Words words(kernels::words_for(n));
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution keep(density);
  for (std::size_t p = 0; p < n; ++p) {
    if (keep(rng)) words[p / 64] |= std::uint64_t{1} << (p % 64);
  }
  return words;
}

// The message size the format rules give for this shard, previous shard and encoding.
std::size_t expected_words(MaskEncoding e, const Words& cur, const Words& prev, std::size_t n) {
  const std::size_t k = kernels::popcount(cur);
  if (mask_sizes_known(e)) return fixed_message_words(e, n, k);
  const std::size_t k_prev = kernels::popcount(prev);
  const std::size_t k_new = k - kernels::popcount_and(cur, prev);
  const ShardFormat f = e == MaskEncoding::delta ? ShardFormat::delta : smallest_format(n, k, k_prev, k_new);
  return tagged_message_words(f, n, k, k_prev, k_new);
}

// Words of the coded mask all-gather when `next` is coded against `prev` (full masks).
std::uint64_t gather_words(MaskEncoding e, const Words& next, const Words& prev, std::size_t n, int workers) {
  const Sharding sharding(n, workers);
  std::uint64_t words = 0;
  for (int w = 0; w < workers; ++w) {
    const std::size_t first = sharding.begin(w) / 64, count = sharding.words(w);
    const Words cur(next.begin() + first, next.begin() + first + count);
    const Words old(prev.begin() + first, prev.begin() + first + count);
    words += expected_words(e, cur, old, sharding.size(w));
  }
  return words;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every worker used the same mask and ended every step with the same parameters, bit for bit.
void check_identical(const scape::testing::RunRecord& run, const scape::testing::RunRecord& reference) {
  REQUIRE(run.steps.size() == reference.steps.size());
  for (std::size_t r = 0; r < run.steps.size(); ++r) {
    REQUIRE(run.steps[r].size() == reference.steps[r].size());
    for (std::size_t t = 0; t < run.steps[r].size(); ++t) {
      CHECK(run.steps[r][t].mask == reference.steps[r][t].mask);
      CHECK(same_bits(run.steps[r][t].params_after, reference.steps[r][t].params_after));
    }
  }
}

}  // namespace

TEST_CASE("shard messages round trip in every encoding, at the sizes of their closed forms") {
  ShardCoder coder(kernels::cpu_backend());
  kernels::Buffer<std::uint64_t> message(kernels::cpu_backend());
  std::uint32_t seed = 1;
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{64}, std::size_t{1000}, std::size_t{70'001}}) {
    for (const double density : {0.0, 0.01, 0.5, 1.0}) {
      for (const double overlap : {0.0, 0.6, 1.0}) {
        const Words prev = random_mask(n, density, ++seed);
        // cur keeps about `overlap` of prev's positions and adds fresh ones.
        Words cur = random_mask(n, density * (1 - overlap), ++seed);
        const Words keep = random_mask(n, overlap, ++seed);
        for (std::size_t w = 0; w < cur.size(); ++w) cur[w] |= prev[w] & keep[w];
        const std::size_t k = kernels::popcount(cur);
        for (const MaskEncoding e : kEncodings) {
          CAPTURE(to_string(e));
          CAPTURE(n);
          CAPTURE(density);
          CAPTURE(overlap);
          coder.encode(e, cur, n, k, prev, message);
          CHECK(message.size() == expected_words(e, cur, prev, n));
          Words decoded(cur.size(), ~std::uint64_t{0});  // decode clears the shard first
          coder.decode(e, message.span(), n, k, prev, decoded, 3);
          CHECK(decoded == cur);
        }
      }
    }
  }
}

TEST_CASE("auto picks the smallest format, and decode rejects a message that does not fit") {
  const std::size_t n = 64 * 1000;
  // At 1% with nothing before, Elias-Fano: 1 + ef_words vs 1 + 1000 bitmap words.
  CHECK(smallest_format(n, n / 100, 0, n / 100) == ShardFormat::elias_fano);
  // Half the coordinates: the bitmap.
  CHECK(smallest_format(n, n / 2, n / 2, n / 4) == ShardFormat::bitmap);
  // The same mask as before: k kept bits and no new position.
  CHECK(smallest_format(n, n / 100, n / 100, 0) == ShardFormat::delta);
  CHECK(tagged_message_words(ShardFormat::delta, n, 640, 640, 0) == 1 + 10);

  ShardCoder coder(kernels::cpu_backend());
  kernels::Buffer<std::uint64_t> message(kernels::cpu_backend());
  const Words cur = random_mask(n, 0.01, 5), prev(cur.size());
  const std::size_t k = kernels::popcount(cur);
  coder.encode(MaskEncoding::auto_select, cur, n, k, prev, message);
  Words out(cur.size());
  message.data()[0] |= 3;  // tag 3 is no format
  CHECK_THROWS_WITH_AS(coder.decode(MaskEncoding::auto_select, message.span(), n, k, prev, out, 2),
                       "mask message of shard 2: unknown format tag 3", std::invalid_argument);
  coder.encode(MaskEncoding::elias_fano, cur, n, k, prev, message);
  CHECK_THROWS_AS(coder.decode(MaskEncoding::elias_fano, message.span(), n, k + 1, prev, out, 0),
                  std::invalid_argument);
}

TEST_CASE("SCAPE trains bit-identically with every mask encoding, and the ledger counts the coded bytes") {
  const ParamLayout layout = mixed_layout(40);  // about 31k coordinates
  const std::size_t n = layout.size();
  constexpr int kSteps = 5;
  for (const int lag : {0, 1}) {
    for (const int workers : {1, 3, 4}) {
      OptimizerConfig config = scape::testing::earlier_formulation();
      config.lr = 0.01;
      config.scape.mask_lag = lag;
      config.density_warmup = 2;  // k changes between steps: delta codes against a smaller mask
      config.mask_encoding = MaskEncoding::bitmap;
      const auto reference = run_quadratic(config, layout, workers, kSteps);
      for (const MaskEncoding e : {MaskEncoding::elias_fano, MaskEncoding::delta, MaskEncoding::auto_select}) {
        CAPTURE(to_string(e));
        CAPTURE(lag);
        CAPTURE(workers);
        config.mask_encoding = e;
        const auto run = run_quadratic(config, layout, workers, kSteps);
        check_identical(run, reference);
        // Bytes: each mask all-gather codes the next mask against the one every rank holds.
        const auto& steps = run.steps[0];
        for (int t = 1; t <= kSteps; ++t) {
          CAPTURE(t);
          const StepMetrics& m = steps[static_cast<std::size_t>(t - 1)].metrics;
          std::vector<std::uint64_t> gathers;
          std::size_t size_gathers = 0;
          for (const CommRecord& rec : m.comm) {
            if (rec.purpose == "mask_all_gather") gathers.push_back(rec.payload_bytes);
            if (rec.purpose == "mask_size_all_gather") {
              ++size_gathers;
              CHECK(rec.payload_bytes == 8u * static_cast<std::uint64_t>(workers));
            }
          }
          CHECK(size_gathers == (mask_sizes_known(e) ? 0 : gathers.size()));
          const Words none(kernels::words_for(n));
          const auto mask_of_step = [&](int s) -> const Words& {
            return s < 1 ? none : steps[static_cast<std::size_t>(s - 1)].mask;
          };
          std::vector<std::uint64_t> expected;
          if (lag == 0 || t == 1)
            expected.push_back(8 * gather_words(e, mask_of_step(t), mask_of_step(t - 1), n, workers));
          if (lag == 1 && t < kSteps)
            expected.push_back(8 * gather_words(e, mask_of_step(t + 1), mask_of_step(t), n, workers));
          CHECK(gathers == expected);
          if (e == MaskEncoding::elias_fano) {
            // The predictor's closed form is exact for Elias-Fano.
            const auto predicted = step_collectives(config, n, workers, t, kSteps, NetworkModel{});
            REQUIRE(predicted.size() == m.comm.size());
            for (std::size_t i = 0; i < predicted.size(); ++i)
              CHECK(predicted[i].payload_bytes == m.comm[i].payload_bytes);
          }
          CHECK(m.mask_codec_s > 0);
        }
      }
    }
  }
}

TEST_CASE("local_union: Elias-Fano coded index lists train bit-identically to raw indices, at the coded size") {
  const ParamLayout layout = mixed_layout(40);
  const std::size_t n = layout.size();
  constexpr int kSteps = 4;
  for (const int lag : {0, 1}) {
    for (const int workers : {1, 3, 4}) {
      CAPTURE(lag);
      CAPTURE(workers);
      OptimizerConfig config = scape::testing::earlier_formulation();
      config.lr = 0.01;
      config.sharded = false;
      config.scape.mask_partition = MaskPartition::local_union;
      config.scape.mask_lag = lag;
      config.mask_encoding = MaskEncoding::bitmap;
      const auto reference = run_quadratic(config, layout, workers, kSteps);
      config.mask_encoding = MaskEncoding::auto_select;  // local_union codes Elias-Fano for every non-bitmap
      const auto run = run_quadratic(config, layout, workers, kSteps);
      check_identical(run, reference);
      const std::size_t k = k_for(config.density(), n);
      for (const auto& worker : run.steps) {
        for (const auto& step : worker) {
          for (const CommRecord& rec : step.metrics.comm) {
            if (rec.purpose == "index_all_gather") CHECK(rec.payload_bytes == 8u * workers * kernels::ef_words(n, k));
          }
        }
      }
    }
  }
}

TEST_CASE("raw-gradient top-k: Elias-Fano coded indices train bit-identically to raw records") {
  const ParamLayout layout = mixed_layout(10);
  for (const int workers : {1, 3, 4}) {
    for (const WireType wire : {WireType::fp32, WireType::bf16}) {
      CAPTURE(workers);
      OptimizerConfig config = scape::testing::earlier_replicated(OptimizerType::topk_ef);
      config.lr = 0.01;
      config.wire_dtype = wire;
      config.mask_encoding = MaskEncoding::bitmap;
      const auto reference = run_quadratic(config, layout, workers, 4);
      config.mask_encoding = MaskEncoding::elias_fano;
      const auto run = run_quadratic(config, layout, workers, 4);
      check_identical(run, reference);
      CHECK(run.steps[0].back().metrics.mask_codec_s > 0);
    }
  }
}
