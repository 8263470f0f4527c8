// Flat layout, shard rule, learning-rate and density schedules, and the k rule.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <stdexcept>

#include "core/layout.hpp"
#include "core/schedule.hpp"

using namespace scape;

TEST_CASE("layout packs tensors back to back with their decay flags") {
  ParamLayout l;
  CHECK(l.add("wte", {10, 4}, false) == 0);
  CHECK(l.add("w", {4, 4}, true) == 1);
  CHECK(l.size() == 56);
  CHECK(l.slot("w").offset == 40);
  CHECK(l.slot("w").decay);
  CHECK_THROWS_WITH_AS(l.add("w", {1}, true), doctest::Contains("duplicate tensor name 'w'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(l.add("z", {3, 0}, true), doctest::Contains("zero dimension"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(l.slot("nope"), doctest::Contains("nope"), std::out_of_range);
}

TEST_CASE("shard rule: s = 64 ceil(N / 64W), shards aligned to 64, short or empty at the end") {
  for (std::size_t n : {1u, 63u, 64u, 65u, 881u, 3140u, 100000u}) {
    for (int w : {1, 2, 3, 4, 7, 16}) {
      CAPTURE(n);
      CAPTURE(w);
      const Sharding sh(n, w);
      const std::size_t s = 64 * ((n + 64 * static_cast<std::size_t>(w) - 1) / (64 * static_cast<std::size_t>(w)));
      CHECK(sh.shard_size() == s);
      CHECK(sh.padded_size() == s * static_cast<std::size_t>(w));
      std::size_t covered = 0, words = 0;
      for (int o = 0; o < w; ++o) {
        if (sh.size(o) > 0) CHECK(sh.begin(o) % 64 == 0);
        CHECK(sh.begin(o) == std::min(n, o * s));
        covered += sh.size(o);
        words += sh.words(o);
        if (sh.size(o) > 0) CHECK(sh.owner(sh.begin(o)) == o);
      }
      CHECK(covered == n);
      CHECK(words == (n + 63) / 64);
    }
  }
  CHECK_THROWS_WITH_AS(Sharding(10, 0), doctest::Contains("workers must be >= 1, got 0"), std::invalid_argument);
}

TEST_CASE("learning rate: linear warm-up then cosine to min_lr") {
  LrSchedule s{1.0, 0.1, 10, 110};
  CHECK(learning_rate(s, 1) == doctest::Approx(0.1));
  CHECK(learning_rate(s, 10) == doctest::Approx(1.0));
  CHECK(learning_rate(s, 60) == doctest::Approx(0.1 + 0.5 * 0.9 * (1 + std::cos(std::numbers::pi * 0.5))));
  CHECK(learning_rate(s, 110) == doctest::Approx(0.1));
  LrSchedule no_warmup{2.0, 0.2, 0, 4};
  CHECK(learning_rate(no_warmup, 1) == doctest::Approx(0.2 + 0.9 * (1 + std::cos(std::numbers::pi / 4))));
  LrSchedule single{1.0, 0.1, 0, 1};
  CHECK(learning_rate(single, 1) == doctest::Approx(0.1));
}

TEST_CASE("density warm-up and the k rule") {
  CHECK(density_at(0.01, 0, 1) == 0.01);
  CHECK(density_at(0.01, 4, 1) == 1.0);
  CHECK(density_at(0.01, 4, 3) == doctest::Approx(0.1));
  CHECK(density_at(0.01, 4, 5) == doctest::Approx(0.01));
  CHECK(density_at(0.01, 4, 50) == doctest::Approx(0.01));
  CHECK(k_for(1.0 - 0.99, 6400) == 64);  // not 65: 1 - 0.99 is 0.010000000000000009
  CHECK(k_for(0.01, 6401) == 65);
  CHECK(k_for(0.5, 3) == 2);
  CHECK(k_for(1e-9, 100) == 1);
  CHECK(k_for(1.0, 77) == 77);
  CHECK(k_for(0.3, 0) == 0);
}
