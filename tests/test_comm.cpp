// EmulatedComm: every collective against a serial reference, rank-order reductions, bf16
// wire rounding, deferred asynchronous all-gather, size checks and failure propagation.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <stdexcept>

#include "core/rng.hpp"
#include "kernels/cpu/bf16.hpp"
#include "sim/emulated_comm.hpp"

using namespace scape;

namespace {

float value(int rank, std::size_t j) { return static_cast<float>(rng::normal(static_cast<std::uint64_t>(rank) + 11, j)); }

// The reference reduction: left-to-right in rank order, then divided by W.
float reference_mean(int workers, std::size_t j, bool bf16) {
  float acc = 0;
  for (int r = 0; r < workers; ++r) {
    const float x = bf16 ? kernels::round_to_bf16(value(r, j)) : value(r, j);
    acc = r == 0 ? x : acc + x;
  }
  const float mean = acc / static_cast<float>(workers);
  return bf16 ? kernels::round_to_bf16(mean) : mean;
}

}  // namespace

TEST_CASE("all_reduce_mean equals the rank-order reference bit for bit") {
  for (int w : {1, 2, 3, 4, 7}) {
    for (bool bf16 : {false, true}) {
      CAPTURE(w);
      CAPTURE(bf16);
      const std::size_t n = 1000;
      std::mutex mu;
      std::vector<std::vector<float>> results(static_cast<std::size_t>(w));
      sim::run_ranks(w, NetworkModel{}, [&](Communicator& comm) {
        std::vector<float> data(n);
        for (std::size_t j = 0; j < n; ++j) data[j] = value(comm.rank(), j);
        comm.all_reduce_mean(data, bf16 ? WireType::bf16 : WireType::fp32, "test");
        std::lock_guard lock(mu);
        results[static_cast<std::size_t>(comm.rank())] = data;
      });
      for (int r = 0; r < w; ++r) {
        for (std::size_t j = 0; j < n; ++j) CHECK(results[static_cast<std::size_t>(r)][j] == reference_mean(w, j, bf16));
      }
    }
  }
}

TEST_CASE("reduce_scatter_mean with uneven counts, all_gather and word gathers") {
  for (int w : {1, 2, 3, 4, 7}) {
    CAPTURE(w);
    std::vector<std::size_t> counts(static_cast<std::size_t>(w));
    for (int r = 0; r < w; ++r) counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(3 * r + (r % 2 ? 0 : 5));
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    std::atomic<int> failures{0};
    sim::run_ranks(w, NetworkModel{}, [&](Communicator& comm) {
      const std::size_t r = static_cast<std::size_t>(comm.rank());
      std::vector<float> send(total);
      for (std::size_t j = 0; j < total; ++j) send[j] = value(comm.rank(), j);
      std::vector<float> recv(counts[r]);
      comm.reduce_scatter_mean(send, recv, counts, WireType::fp32, "rs");
      const std::size_t offset = std::accumulate(counts.begin(), counts.begin() + comm.rank(), std::size_t{0});
      for (std::size_t j = 0; j < recv.size(); ++j) {
        if (recv[j] != reference_mean(w, offset + j, false)) failures++;
      }
      // all_gather: rank r contributes counts[r] values equal to r*1000 + j.
      std::vector<float> mine(counts[r]);
      for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = static_cast<float>(r * 1000 + j);
      std::vector<float> all(total);
      comm.all_gather(mine, all, counts, WireType::fp32, "ag");
      std::size_t pos = 0;
      for (std::size_t q = 0; q < counts.size(); ++q) {
        for (std::size_t j = 0; j < counts[q]; ++j) {
          if (all[pos++] != static_cast<float>(q * 1000 + j)) failures++;
        }
      }
      std::vector<std::uint64_t> words(counts[r], 0xabc0000000000000ull + r);
      std::vector<std::uint64_t> gathered(total);
      comm.all_gather_words(words, gathered, counts, "words");
      pos = 0;
      for (std::size_t q = 0; q < counts.size(); ++q) {
        for (std::size_t j = 0; j < counts[q]; ++j) {
          if (gathered[pos++] != 0xabc0000000000000ull + q) failures++;
        }
      }
    });
    CHECK(failures == 0);
  }
}

TEST_CASE("asynchronous all-gather delivers only at wait") {
  std::atomic<int> stale_before_wait{0}, correct_after_wait{0};
  sim::run_ranks(3, NetworkModel{}, [&](Communicator& comm) {
    const std::vector<std::size_t> counts{1, 1, 1};
    std::vector<std::uint64_t> send{static_cast<std::uint64_t>(comm.rank() + 1)};
    std::vector<std::uint64_t> recv(3, 0);
    auto handle = comm.all_gather_words_async(send, recv, counts, "lagged");
    CHECK(handle.pending());
    if (recv == std::vector<std::uint64_t>{0, 0, 0}) stale_before_wait++;
    handle.wait();
    CHECK_FALSE(handle.pending());
    if (recv == std::vector<std::uint64_t>{1, 2, 3}) correct_after_wait++;
    CHECK(comm.ledger().drain().at(0).overlapped);
  });
  CHECK(stale_before_wait == 3);
  CHECK(correct_after_wait == 3);
}

TEST_CASE("mismatched buffer sizes are clear errors naming the collective") {
  sim::run_ranks(2, NetworkModel{}, [&](Communicator& comm) {
    const std::vector<std::size_t> counts{2, 3};
    std::vector<float> send(4), recv(2);
    CHECK_THROWS_WITH_AS(comm.reduce_scatter_mean(send, recv, counts, WireType::fp32, "grad_reduce_scatter"),
                         doctest::Contains("grad_reduce_scatter"), std::invalid_argument);
    std::vector<float> mine(1), all(5);
    CHECK_THROWS_WITH_AS(comm.all_gather(mine, all, counts, WireType::fp32, "param_all_gather"),
                         doctest::Contains("param_all_gather"), std::invalid_argument);
    const std::vector<std::size_t> short_counts{5};
    CHECK_THROWS_AS(comm.all_gather(mine, all, short_counts, WireType::fp32, "x"), std::invalid_argument);
  });
  CHECK_THROWS_WITH_AS(sim::EmulatedGroup(0), doctest::Contains("workers must be >= 1"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_wire_type("fp8", "optimizer.wire_dtype"), doctest::Contains("fp8"), std::invalid_argument);
}

TEST_CASE("a rank that throws aborts the others instead of hanging, and its error is rethrown") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(sim::run_ranks(4, NetworkModel{}, [](Communicator& comm) {
                         if (comm.rank() == 2) throw std::runtime_error("rank 2: bad data file");
                         std::vector<float> x(10, 1.0f);
                         for (int i = 0; i < 100; ++i) comm.all_reduce_mean(x, WireType::fp32, "loop");
                       }),
                       "rank 2: bad data file", std::runtime_error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("the ledger counts bytes at the wire width") {
  sim::run_ranks(4, NetworkModel{1e-6, 1e9}, [](Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    comm.all_reduce_mean(x, WireType::bf16, "ar");
    const auto recs = comm.ledger().drain();
    REQUIRE(recs.size() == 1);
    CHECK(recs[0].payload_bytes == 2000);
    CHECK(recs[0].bytes_sent_per_worker == doctest::Approx(2.0 * 3.0 / 4.0 * 2000));
    CHECK(recs[0].modelled_time_s == doctest::Approx(6e-6 + 3000 / 1e9));
  });
}
