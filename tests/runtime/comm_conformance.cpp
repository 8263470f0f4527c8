// The conformance cases and their checks (comm_conformance.hpp): inputs, expected results and
// expected ledger records, for every communicator backend alike.
#include "tests/runtime/comm_conformance.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "kernels/cpu/bf16.hpp"
#include "util/rng.hpp"

namespace scape::conformance {

namespace {

// The cases of every driver. NcclComm's fast paths take equal counts, its grouped paths the
// others; the async gathers differ from the sync ones in backends (MPI's comm thread, the
// emulated deferral, NCCL's events), so both run.
constexpr CommCase kCases[] = {
    {Collective::all_reduce_mean, Counts::long_vector, WireType::fp32},
    {Collective::all_reduce_mean, Counts::long_vector, WireType::bf16},
    {Collective::reduce_scatter_mean, Counts::uneven, WireType::fp32},
    {Collective::reduce_scatter_mean, Counts::equal, WireType::fp32},
    {Collective::reduce_scatter_mean, Counts::uneven, WireType::bf16},
    {Collective::reduce_scatter_mean, Counts::equal, WireType::bf16},
    {Collective::reduce_scatter_mean_async, Counts::uneven, WireType::fp32},
    {Collective::reduce_scatter_mean_async, Counts::equal, WireType::fp32},
    {Collective::reduce_scatter_mean_async, Counts::with_zero, WireType::fp32},
    {Collective::all_gather, Counts::uneven, WireType::fp32},
    {Collective::all_gather, Counts::equal, WireType::fp32},
    {Collective::all_gather, Counts::with_zero, WireType::fp32},
    {Collective::all_gather, Counts::uneven, WireType::bf16},
    {Collective::all_gather, Counts::equal, WireType::bf16},
    {Collective::all_gather, Counts::with_zero, WireType::bf16},
    {Collective::all_gather_in_place, Counts::uneven, WireType::fp32},
    {Collective::all_gather_words, Counts::uneven, WireType::fp32},
    {Collective::all_gather_words, Counts::equal, WireType::fp32},
    {Collective::all_gather_words_async, Counts::uneven, WireType::fp32},
    {Collective::all_gather_words_async, Counts::equal, WireType::fp32},
    {Collective::all_gather_bytes, Counts::odd_bytes, WireType::fp32},
    {Collective::all_gather_bytes, Counts::equal, WireType::fp32},
    {Collective::all_gather_bytes, Counts::with_zero, WireType::fp32},
    {Collective::all_gather_bytes_async, Counts::odd_bytes, WireType::fp32},
    {Collective::all_gather_bytes_async, Counts::equal, WireType::fp32},
    {Collective::all_gather_bytes_async, Counts::with_zero, WireType::fp32},
    {Collective::all_to_all_bytes, Counts::odd_bytes, WireType::fp32},
    {Collective::all_to_all_bytes, Counts::equal, WireType::fp32},
    {Collective::all_to_all_bytes, Counts::with_zero, WireType::fp32},
};

const char* name_of(Collective c) {
  switch (c) {
    case Collective::all_reduce_mean: return "all_reduce_mean";
    case Collective::reduce_scatter_mean: return "reduce_scatter_mean";
    case Collective::reduce_scatter_mean_async: return "reduce_scatter_mean_async";
    case Collective::all_gather: return "all_gather";
    case Collective::all_gather_in_place: return "all_gather_in_place";
    case Collective::all_gather_words: return "all_gather_words";
    case Collective::all_gather_words_async: return "all_gather_words_async";
    case Collective::all_gather_bytes: return "all_gather_bytes";
    case Collective::all_gather_bytes_async: return "all_gather_bytes_async";
    case Collective::all_to_all_bytes: return "all_to_all_bytes";
  }
  return "unknown";
}

const char* name_of(Counts c) {
  switch (c) {
    case Counts::long_vector: return "long_vector";
    case Counts::equal: return "equal";
    case Counts::uneven: return "uneven";
    case Counts::with_zero: return "with_zero";
    case Counts::odd_bytes: return "odd_bytes";
  }
  return "unknown";
}

std::size_t sum_of(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

std::size_t offset_of(const std::vector<std::size_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, std::size_t{0});
}

float on_wire(float x, WireType wire) { return wire == WireType::bf16 ? kernels::round_to_bf16(x) : x; }

// What rank q sends as its j-th word or byte in the gathers.
std::uint64_t word_of(std::size_t q, std::size_t j) { return 0xabc0000000000000ull + (q << 20) + j; }
std::byte byte_of(std::size_t q, std::size_t j) { return static_cast<std::byte>((q * 37 + j * 11) & 0xff); }

// Elements of `got` (the concatenation over ranks q of counts[q] elements) unequal to want(q, j).
template <typename T, typename Want>
std::size_t gather_mismatches(std::span<const T> got, const std::vector<std::size_t>& counts, Want want) {
  std::size_t bad = 0, pos = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    for (std::size_t j = 0; j < counts[q]; ++j) bad += !(got[pos++] == want(q, j));
  }
  return bad;
}

double bf16_ulp(float x) { return std::ldexp(1.0, std::ilogb(x == 0 ? 1.0f : x) - 7); }

// got[j] is the mean of index first + j.
void check_means(std::span<const float> got, std::size_t first, int workers, WireType wire, MeanMatch match,
                 MeanStats& stats) {
  std::size_t bad = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const float a = got[j], b = reference_mean(workers, first + j, wire);
    const double d = std::fabs(static_cast<double>(a) - b);
    stats.worst_relative = std::max(stats.worst_relative, d / (1.0 + std::fabs(b)));
    stats.bit_identical += a == b;
    stats.total += 1;
    if (match == MeanMatch::bit_identical) {
      bad += a != b;
    } else if (match == MeanMatch::relative_1e6_bf16_ulp && wire == WireType::bf16) {
      bad += d > bf16_ulp(b);
    } else {
      bad += d > 1e-6 * (1.0 + std::fabs(b));
    }
    // bf16 results must be bf16 values whatever the order of the sum.
    if (wire == WireType::bf16) bad += kernels::round_to_bf16(a) != a;
  }
  CHECK(bad == 0);
}

// The one record a case leaves, against the ring closed forms of docs/algorithms.md: an
// all-reduce sends 2(W-1)/W of its payload per worker in 2(W-1) steps, a reduce-scatter, an
// all-gather or an all-to-all (W-1)/W in W-1 steps; modelled time = steps * alpha + sent / bandwidth.
// Written with the ledger's operations in its order, so equal to the last bit.
void check_one_record(const CommRecord& r, const Communicator& comm, const std::string& purpose, CollectiveKind kind,
                      std::uint64_t payload, bool overlapped) {
  const bool all_reduce = kind == CollectiveKind::all_reduce;
  const double w = comm.size();
  const double share = (w - 1.0) / w;
  const double sent = all_reduce ? 2.0 * share * static_cast<double>(payload) : share * static_cast<double>(payload);
  const int steps = all_reduce ? 2 * (comm.size() - 1) : comm.size() - 1;
  CHECK(r.purpose == purpose);
  CHECK(r.kind == kind);
  CHECK(r.payload_bytes == payload);
  CHECK(r.bytes_sent_per_worker == sent);
  CHECK(r.latency_steps == steps);
  CHECK(r.modelled_time_s == steps * kNetwork.alpha_s + (sent > 0 ? sent / kNetwork.bandwidth_Bps : 0.0));
  CHECK(r.overlapped == overlapped);
}

void check_record(Communicator& comm, const std::string& purpose, CollectiveKind kind, std::uint64_t payload,
                  bool overlapped) {
  const auto records = comm.ledger().drain();
  REQUIRE(records.size() == 1);
  check_one_record(records[0], comm, purpose, kind, payload, overlapped);
  CHECK_FALSE(records[0].in_backward);
}

void all_reduce_case(Communicator& comm, const CommCase& c, MeanMatch match, Memory& memory, MeanStats& stats) {
  const std::size_t n = counts_of(c.counts, comm.size())[static_cast<std::size_t>(comm.rank())];
  const auto data = take<float>(memory, n);
  for (std::size_t j = 0; j < n; ++j) data[j] = value(comm.rank(), j);
  comm.all_reduce_mean(data, c.wire, name_of(c));
  check_means(data, 0, comm.size(), c.wire, match, stats);
  check_record(comm, name_of(c), CollectiveKind::all_reduce, n * wire_bytes(c.wire), false);
}

void reduce_scatter_case(Communicator& comm, const CommCase& c, MeanMatch match, Memory& memory, MeanStats& stats) {
  const auto counts = counts_of(c.counts, comm.size());
  const std::size_t total = sum_of(counts);
  const auto send = take<float>(memory, total);
  const auto recv = take<float>(memory, counts[static_cast<std::size_t>(comm.rank())]);
  for (std::size_t j = 0; j < total; ++j) send[j] = value(comm.rank(), j);
  comm.reduce_scatter_mean(send, recv, counts, c.wire, name_of(c));
  check_means(recv, offset_of(counts, comm.rank()), comm.size(), c.wire, match, stats);
  check_record(comm, name_of(c), CollectiveKind::reduce_scatter, total * wire_bytes(c.wire), false);
}

// The reduce-scatter of the same values as two buckets, [0, h) and [h, total), the way
// overlap_grad_reduce starts them: each rank receives the part of a bucket inside its segment.
void reduce_scatter_async_case(Communicator& comm, const CommCase& c, MeanMatch match, Memory& memory,
                               MeanStats& stats) {
  const auto counts = counts_of(c.counts, comm.size());
  const std::size_t total = sum_of(counts), h = total / 2 + 1;
  const std::size_t mine = static_cast<std::size_t>(comm.rank());
  const std::size_t first = offset_of(counts, comm.rank());
  const auto send = take<float>(memory, total);
  const auto recv = take<float>(memory, counts[mine]);
  for (std::size_t j = 0; j < total; ++j) send[j] = value(comm.rank(), j);
  std::vector<PendingCollective> pending;
  std::size_t recv_offset = 0;
  for (const auto& [lo, hi] : {std::pair<std::size_t, std::size_t>{0, h}, {h, total}}) {
    std::vector<std::size_t> part(counts.size());
    for (std::size_t q = 0; q < counts.size(); ++q) {
      const std::size_t a = std::max(lo, offset_of(counts, static_cast<int>(q)));
      const std::size_t b = std::min(hi, offset_of(counts, static_cast<int>(q)) + counts[q]);
      part[q] = b > a ? b - a : 0;
    }
    pending.push_back(comm.reduce_scatter_mean_async(send.subspan(lo, hi - lo), recv.subspan(recv_offset, part[mine]),
                                                     part, name_of(c)));
    recv_offset += part[mine];
  }
  for (auto& p : pending) p.wait();
  REQUIRE(recv_offset == counts[mine]);
  check_means(recv, first, comm.size(), c.wire, match, stats);
  const auto records = comm.ledger().drain();
  REQUIRE(records.size() == 2);
  check_one_record(records[0], comm, name_of(c), CollectiveKind::reduce_scatter, h * sizeof(float), false);
  check_one_record(records[1], comm, name_of(c), CollectiveKind::reduce_scatter, (total - h) * sizeof(float), false);
  CHECK(records[0].in_backward);
  CHECK(records[1].in_backward);
}

void all_gather_case(Communicator& comm, const CommCase& c, Memory& memory) {
  const auto counts = counts_of(c.counts, comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank()), offset = offset_of(counts, comm.rank());
  const auto all = take<float>(memory, sum_of(counts));
  // In place, as the dense optimizer gathers parameters: send from this rank's segment of all.
  const bool in_place = c.collective == Collective::all_gather_in_place;
  const auto mine = in_place ? all.subspan(offset, counts[me]) : take<float>(memory, counts[me]);
  for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = value(comm.rank(), j);
  comm.all_gather(mine, all, counts, c.wire, name_of(c));
  const auto want = [&](std::size_t q, std::size_t j) { return on_wire(value(static_cast<int>(q), j), c.wire); };
  CHECK(gather_mismatches<float>(all, counts, want) == 0);
  check_record(comm, name_of(c), CollectiveKind::all_gather, all.size() * wire_bytes(c.wire), false);
}

// Words and bytes travel unchanged, synchronously or asynchronously. element(q, j): rank q's
// j-th word or byte.
template <typename T>
void raw_gather_case(Communicator& comm, const CommCase& c, Memory& memory, T (*element)(std::size_t, std::size_t)) {
  const auto counts = counts_of(c.counts, comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank());
  const auto mine = take<T>(memory, counts[me]);
  const auto all = take<T>(memory, sum_of(counts));
  for (std::size_t j = 0; j < mine.size(); ++j) mine[j] = element(me, j);
  const bool async =
      c.collective == Collective::all_gather_words_async || c.collective == Collective::all_gather_bytes_async;
  if constexpr (std::is_same_v<T, std::byte>) {
    if (async) {
      comm.all_gather_bytes_async(mine, all, counts, name_of(c)).wait();
    } else {
      comm.all_gather_bytes(mine, all, counts, name_of(c));
    }
  } else if (async) {
    comm.all_gather_words_async(mine, all, counts, name_of(c)).wait();
  } else {
    comm.all_gather_words(mine, all, counts, name_of(c));
  }
  CHECK(gather_mismatches<T>(all, counts, element) == 0);
  check_record(comm, name_of(c), CollectiveKind::all_gather, all.size() * sizeof(T), async);
}

// Rank q sends segment r (counts[r] bytes, byte j = sent_byte(q, r, j)) to rank r; this rank
// receives segment `rank` of every rank, in rank order. An all-to-all sends (W-1)/W of its
// payload in W-1 exchanges, as a reduce-scatter does.
std::byte sent_byte(std::size_t q, std::size_t r, std::size_t j) {
  return static_cast<std::byte>((q * 53 + r * 29 + j * 7 + 1) & 0xff);
}

void all_to_all_case(Communicator& comm, const CommCase& c, Memory& memory) {
  const auto counts = counts_of(c.counts, comm.size());
  const std::size_t me = static_cast<std::size_t>(comm.rank());
  const auto send = take<std::byte>(memory, sum_of(counts));
  const auto recv = take<std::byte>(memory, counts[me] * counts.size());
  for (std::size_t r = 0, pos = 0; r < counts.size(); ++r) {
    for (std::size_t j = 0; j < counts[r]; ++j) send[pos++] = sent_byte(me, r, j);
  }
  comm.all_to_all_bytes(send, recv, counts, name_of(c));
  const std::vector<std::size_t> received(counts.size(), counts[me]);
  const auto want = [&](std::size_t q, std::size_t j) { return sent_byte(q, me, j); };
  CHECK(gather_mismatches<std::byte>(recv, received, want) == 0);
  check_record(comm, name_of(c), CollectiveKind::all_to_all, send.size(), false);
}

}  // namespace

float value(int rank, std::size_t i) {
  return static_cast<float>(rng::normal(static_cast<std::uint64_t>(rank) + 5, i));
}

float reference_mean(int workers, std::size_t i, WireType wire) {
  float acc = 0;
  for (int r = 0; r < workers; ++r) {
    const float x = on_wire(value(r, i), wire);
    acc = r == 0 ? x : acc + x;
  }
  return on_wire(acc / static_cast<float>(workers), wire);
}

std::vector<std::size_t> counts_of(Counts counts, int workers) {
  std::vector<std::size_t> out(static_cast<std::size_t>(workers));
  for (std::size_t q = 0; q < out.size(); ++q) {
    switch (counts) {
      case Counts::long_vector: out[q] = 1037; break;
      case Counts::equal: out[q] = 64; break;
      case Counts::uneven: out[q] = 3 * q + (q % 2 ? 0 : 5); break;
      case Counts::with_zero: out[q] = q == 1 ? 0 : 9; break;
      case Counts::odd_bytes: out[q] = 7 * q + 3; break;
    }
  }
  return out;
}

std::span<const CommCase> cases() { return kCases; }

std::string name_of(const CommCase& c) {
  std::string name = std::string(name_of(c.collective)) + " " + name_of(c.counts);
  const bool floats = c.collective == Collective::all_reduce_mean || c.collective == Collective::reduce_scatter_mean ||
                      c.collective == Collective::reduce_scatter_mean_async ||
                      c.collective == Collective::all_gather || c.collective == Collective::all_gather_in_place;
  return floats ? name + " " + to_string(c.wire) : name;
}

void* HostMemory::zeroed(std::size_t bytes) {
  const std::size_t words = std::max<std::size_t>((bytes + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t), 1);
  blocks_.push_back(std::make_unique<std::uint64_t[]>(words));  // value-initialised: zeros
  return blocks_.back().get();
}

MeanStats run_cases(Communicator& comm, MeanMatch match, Memory& memory) {
  MeanStats stats;
  for (const CommCase& c : cases()) {
    const std::string name = name_of(c);
    CAPTURE(name);
    switch (c.collective) {
      case Collective::all_reduce_mean: all_reduce_case(comm, c, match, memory, stats); break;
      case Collective::reduce_scatter_mean: reduce_scatter_case(comm, c, match, memory, stats); break;
      case Collective::reduce_scatter_mean_async: reduce_scatter_async_case(comm, c, match, memory, stats); break;
      case Collective::all_gather:
      case Collective::all_gather_in_place: all_gather_case(comm, c, memory); break;
      case Collective::all_gather_words:
      case Collective::all_gather_words_async: raw_gather_case(comm, c, memory, word_of); break;
      case Collective::all_gather_bytes:
      case Collective::all_gather_bytes_async: raw_gather_case(comm, c, memory, byte_of); break;
      case Collective::all_to_all_bytes: all_to_all_case(comm, c, memory); break;
    }
    memory.release_all();
  }
  comm.barrier();
  return stats;
}

}  // namespace scape::conformance
