// EmulatedComm: the conformance cases (comm_conformance.hpp) at W = 1..4 and 7, and what only
// the emulation has: the asynchronous all-gather delivering exactly at wait, size checks and
// failure propagation between thread ranks.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "sim/emulated_comm.hpp"
#include "tests/runtime/comm_conformance.hpp"

using namespace scape;

TEST_CASE("EmulatedComm passes every conformance case bit for bit") {
  for (int w : {1, 2, 3, 4, 7}) {
    CAPTURE(w);
    sim::run_ranks(w, conformance::kNetwork, [](Communicator& comm) {
      conformance::HostMemory memory;
      conformance::run_cases(comm, conformance::MeanMatch::bit_identical, memory);
    });
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

// The train loop's failure path: a failing rank aborts its communicator, then settles its
// pending collectives so no in-flight collective reads freed buffers. The deferred all-gather it
// waits for must then fail at once; run as a collective of its own, it would be matched with
// the peer's unrelated barrier (a use-after-free that ASan caught in a simulated run).
TEST_CASE("a failing rank's pending all-gather, after abort, is not matched with a peer's barrier") {
  std::atomic<int> barrier_matched{0}, wait_aborted{0};
  CHECK_THROWS_WITH_AS(sim::run_ranks(2, NetworkModel{}, [&](Communicator& comm) {
                         const std::vector<std::size_t> counts{1, 1};
                         std::vector<std::uint64_t> send{1}, recv(2);
                         auto pending = comm.all_gather_words_async(send, recv, counts, "lagged");
                         if (comm.rank() == 0) {
                           comm.abort();
                           try {
                             pending.wait();
                           } catch (const sim::CommAborted&) {
                             ++wait_aborted;
                           }
                           throw std::runtime_error("rank 0: cannot write the run file");
                         }
                         comm.barrier();
                         ++barrier_matched;  // only reached when the bug is present
                         comm.barrier();     // releases rank 0's all-gather so the test ends
                       }),
                       "rank 0: cannot write the run file", std::runtime_error);
  CHECK(wait_aborted == 1);
  CHECK(barrier_matched == 0);
}

TEST_CASE("mean_in_rank_order adds in rank order and refuses an output that overlaps an input") {
  // 2^24 + 1 + 1: left to right each +1 is lost (ties to even); 1 + 1 first would keep 2.
  const std::vector<float> a = {0x1p24f, 3.0f}, b = {1.0f, 6.0f}, c = {1.0f, -3.0f};
  const std::vector<const float*> inputs = {a.data(), b.data(), c.data()};
  std::vector<float> out(2);
  mean_in_rank_order(inputs, out);
  CHECK(out[0] == 0x1p24f / 3.0f);
  CHECK(out[1] == 2.0f);
  std::vector<float> in_place = a;
  const std::vector<const float*> overlapping = {b.data(), in_place.data()};
  CHECK_THROWS_WITH_AS(mean_in_rank_order(overlapping, std::span<float>(in_place).first(1)),
                       "mean_in_rank_order: the output overlaps an input", std::invalid_argument);
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
