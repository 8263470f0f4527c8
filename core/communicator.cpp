// Communicator front end: size checks, wire rounding and ledger records for every backend.
#include "core/communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/cpu/bf16.hpp"
#include "util/name_table.hpp"

namespace scape {

std::size_t wire_bytes(WireType w) {
  switch (w) {
    case WireType::bf16: return 2;
    case WireType::fp8_e5m2: return 1;
    case WireType::fp32: break;
  }
  return 4;
}

constexpr EnumName<WireType> kWireTypes[] = {
    {"fp32", WireType::fp32}, {"bf16", WireType::bf16}, {"fp8_e5m2", WireType::fp8_e5m2}};

const char* to_string(WireType w) { return name_of(kWireTypes, w); }
std::vector<std::string> wire_type_names() { return names_of(kWireTypes); }

WireType parse_wire_type(std::string_view value, std::string_view parameter) {
  return find_by_name(kWireTypes, value, parameter).value;
}

void PendingCollective::wait() {
  if (!request_) return;
  // Release the handle even when wait throws, so a failed collective is not waited twice.
  std::unique_ptr<AsyncRequest> r = std::move(request_);
  r->wait();
}

Communicator::Communicator(int rank, int size, NetworkModel net, LinkClass link)
    : rank_(rank), size_(size), ledger_(size, net, link) {
  if (size < 1) throw std::invalid_argument("Communicator: size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    throw std::invalid_argument("Communicator: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(size) + ")");
  }
}

namespace {

std::size_t total(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

[[noreturn]] void size_error(std::string_view purpose, const std::string& what) {
  throw std::invalid_argument("collective '" + std::string(purpose) + "': " + what);
}

}  // namespace

// Measures one synchronous collective for take_measured_times: the device's own time when the
// backend has one, else the host's wall time around the call.
class Communicator::MeasuredCall {
 public:
  MeasuredCall(Communicator& comm, std::string_view purpose) : comm_(comm), purpose_(purpose) {
    (void)comm_.take_device_seconds();  // a value left by an untimed call (to_wire, a barrier)
  }
  ~MeasuredCall() {
    const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    comm_.add_blocking_time(purpose_, comm_.take_device_seconds().value_or(host));
  }
  MeasuredCall(const MeasuredCall&) = delete;
  MeasuredCall& operator=(const MeasuredCall&) = delete;

 private:
  Communicator& comm_;
  std::string_view purpose_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

void Communicator::to_wire(std::span<const float> in, std::span<float> out, WireType wire) {
  if (wire == WireType::bf16) {
    for (std::size_t j = 0; j < in.size(); ++j) out[j] = kernels::round_to_bf16(in[j]);
  } else if (in.data() != out.data()) {
    std::copy(in.begin(), in.end(), out.begin());
  }
}

std::span<float> Communicator::wire_scratch(std::size_t n) {
  wire_scratch_.resize(n);
  return {wire_scratch_.data(), n};
}

void Communicator::check_gather(std::size_t send, std::size_t recv, std::span<const std::size_t> counts,
                                std::string_view purpose) const {
  if (counts.size() != static_cast<std::size_t>(size_)) {
    size_error(purpose, "counts has " + std::to_string(counts.size()) + " entries for " + std::to_string(size_) +
                            " ranks");
  }
  if (send != counts[static_cast<std::size_t>(rank_)]) {
    size_error(purpose, "rank " + std::to_string(rank_) + " sends " + std::to_string(send) +
                            " elements but counts says " + std::to_string(counts[static_cast<std::size_t>(rank_)]));
  }
  if (recv != total(counts)) {
    size_error(purpose, "receive buffer holds " + std::to_string(recv) + " elements, counts sum to " +
                            std::to_string(total(counts)));
  }
}

void Communicator::all_reduce_mean(std::span<float> data, WireType wire, std::string_view purpose) {
  if (wire == WireType::bf16) to_wire(data, data, WireType::bf16);
  ledger_.record(CollectiveKind::all_reduce, purpose, data.size() * wire_bytes(wire), false);
  {
    const MeasuredCall timer(*this, purpose);
    do_all_reduce_mean(data);
  }
  if (wire == WireType::bf16) to_wire(data, data, WireType::bf16);
}

void Communicator::check_scatter(std::size_t send, std::size_t recv, std::span<const std::size_t> counts,
                                 std::string_view purpose) const {
  if (counts.size() != static_cast<std::size_t>(size_)) {
    size_error(purpose, "counts has " + std::to_string(counts.size()) + " entries for " + std::to_string(size_) +
                            " ranks");
  }
  if (send != total(counts)) {
    size_error(purpose, "send buffer holds " + std::to_string(send) + " elements, counts sum to " +
                            std::to_string(total(counts)));
  }
  if (recv != counts[static_cast<std::size_t>(rank_)]) {
    size_error(purpose, "rank " + std::to_string(rank_) + " receive buffer holds " + std::to_string(recv) +
                            " elements but counts says " + std::to_string(counts[static_cast<std::size_t>(rank_)]));
  }
}

std::unique_ptr<AsyncRequest> Communicator::do_reduce_scatter_mean_async(std::span<const float> send,
                                                                         std::span<float> recv,
                                                                         std::span<const std::size_t> counts) {
  std::vector<std::size_t> own_counts(counts.begin(), counts.end());
  return std::make_unique<DeferredCollective>(
      [this, send, recv, own_counts] { do_reduce_scatter_mean(send, recv, own_counts); });
}

PendingCollective Communicator::reduce_scatter_mean_async(std::span<const float> send, std::span<float> recv,
                                                          std::span<const std::size_t> counts,
                                                          std::string_view purpose) {
  check_scatter(send.size(), recv.size(), counts, purpose);
  ledger_.record_backward_bucket(CollectiveKind::reduce_scatter, purpose, send.size() * sizeof(float));
  return PendingCollective(do_reduce_scatter_mean_async(send, recv, counts));
}

void Communicator::reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                                       std::span<const std::size_t> counts, WireType wire,
                                       std::string_view purpose) {
  check_scatter(send.size(), recv.size(), counts, purpose);
  ledger_.record(CollectiveKind::reduce_scatter, purpose, send.size() * wire_bytes(wire), false);
  if (wire == WireType::bf16) {
    const std::span<float> scratch = wire_scratch(send.size());
    to_wire(send, scratch, WireType::bf16);
    {
      const MeasuredCall timer(*this, purpose);
      do_reduce_scatter_mean(scratch, recv, counts);
    }
    to_wire(recv, recv, WireType::bf16);
  } else {
    {
      const MeasuredCall timer(*this, purpose);
      do_reduce_scatter_mean(send, recv, counts);
    }
  }
}

void Communicator::all_gather(std::span<const float> send, std::span<float> recv,
                              std::span<const std::size_t> counts, WireType wire, std::string_view purpose) {
  check_gather(send.size(), recv.size(), counts, purpose);
  ledger_.record(CollectiveKind::all_gather, purpose, recv.size() * wire_bytes(wire), false);
  // A private copy of the send buffer lets callers gather into the buffer they send from.
  const std::span<float> scratch = wire_scratch(send.size());
  to_wire(send, scratch, wire);
  byte_counts_.resize(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) byte_counts_[r] = counts[r] * sizeof(float);
  {
    const MeasuredCall timer(*this, purpose);
    do_all_gather_bytes(std::as_bytes(std::span<const float>(scratch)), std::as_writable_bytes(recv), byte_counts_);
  }
}

void Communicator::all_gather_words(std::span<const std::uint64_t> send, std::span<std::uint64_t> recv,
                                    std::span<const std::size_t> counts, std::string_view purpose) {
  check_gather(send.size(), recv.size(), counts, purpose);
  ledger_.record(CollectiveKind::all_gather, purpose, recv.size() * sizeof(std::uint64_t), false);
  byte_counts_.resize(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) byte_counts_[r] = counts[r] * sizeof(std::uint64_t);
  {
    const MeasuredCall timer(*this, purpose);
    do_all_gather_bytes(std::as_bytes(send), std::as_writable_bytes(recv), byte_counts_);
  }
}

PendingCollective Communicator::all_gather_words_async(std::span<const std::uint64_t> send,
                                                      std::span<std::uint64_t> recv,
                                                      std::span<const std::size_t> counts,
                                                      std::string_view purpose) {
  check_gather(send.size(), recv.size(), counts, purpose);
  ledger_.record(CollectiveKind::all_gather, purpose, recv.size() * sizeof(std::uint64_t), true);
  std::vector<std::size_t> bytes(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * sizeof(std::uint64_t);
  return PendingCollective(do_all_gather_bytes_async(std::as_bytes(send), std::as_writable_bytes(recv), bytes));
}

void Communicator::all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                    std::span<const std::size_t> counts, std::string_view purpose) {
  check_gather(send.size(), recv.size(), counts, purpose);
  ledger_.record(CollectiveKind::all_gather, purpose, recv.size(), false);
  {
    const MeasuredCall timer(*this, purpose);
    do_all_gather_bytes(send, recv, counts);
  }
}

PendingCollective Communicator::all_gather_bytes_async(std::span<const std::byte> send, std::span<std::byte> recv,
                                                      std::span<const std::size_t> counts,
                                                      std::string_view purpose) {
  check_gather(send.size(), recv.size(), counts, purpose);
  ledger_.record(CollectiveKind::all_gather, purpose, recv.size(), true);
  return PendingCollective(do_all_gather_bytes_async(send, recv, counts));
}

void Communicator::all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                    std::span<const std::size_t> counts, std::string_view purpose) {
  if (counts.size() != static_cast<std::size_t>(size_)) {
    size_error(purpose, "counts has " + std::to_string(counts.size()) + " entries for " + std::to_string(size_) +
                            " ranks");
  }
  if (send.size() != total(counts)) {
    size_error(purpose, "send buffer holds " + std::to_string(send.size()) + " bytes, counts sum to " +
                            std::to_string(total(counts)));
  }
  const std::size_t mine = counts[static_cast<std::size_t>(rank_)] * static_cast<std::size_t>(size_);
  if (recv.size() != mine) {
    size_error(purpose, "rank " + std::to_string(rank_) + " receive buffer holds " + std::to_string(recv.size()) +
                            " bytes but W counts[rank] is " + std::to_string(mine));
  }
  ledger_.record(CollectiveKind::all_to_all, purpose, send.size(), false);
  const MeasuredCall timer(*this, purpose);
  do_all_to_all_bytes(send, recv, counts);
}

void Communicator::barrier() { do_barrier(); }

std::unique_ptr<Communicator> Communicator::split(int /*color*/, LinkClass /*link*/, NetworkModel /*net*/) {
  throw std::logic_error(
      "this communicator backend has no groups (NCCL's is not built): optimizer.hierarchy = \"node\" runs in the "
      "simulator and over MPI");
}

void Communicator::add_measured_time(std::string_view purpose, double seconds) {
  std::lock_guard lock(measured_mutex_);
  measured_[std::string(purpose)] += seconds;
}

void Communicator::add_blocking_time(std::string_view purpose, double seconds) {
  std::lock_guard lock(measured_mutex_);
  measured_[std::string(purpose)] += seconds;
  blocking_seconds_ += seconds;
}

void Communicator::add_exposed_wait(CollectiveKind kind, double seconds) {
  std::lock_guard lock(measured_mutex_);
  exposed_wait_[static_cast<std::size_t>(kind)] += seconds;
}

std::map<std::string, double> Communicator::take_measured_times() {
  std::lock_guard lock(measured_mutex_);
  std::map<std::string, double> out;
  out.swap(measured_);
  return out;
}

double Communicator::take_blocking_seconds() {
  std::lock_guard lock(measured_mutex_);
  const double s = blocking_seconds_;
  blocking_seconds_ = 0;
  return s;
}

double Communicator::take_exposed_wait(CollectiveKind kind) {
  std::lock_guard lock(measured_mutex_);
  const double w = exposed_wait_[static_cast<std::size_t>(kind)];
  exposed_wait_[static_cast<std::size_t>(kind)] = 0;
  return w;
}

void Communicator::absorb_measurements(Communicator& group) {
  const auto times = group.take_measured_times();
  const double blocking = group.take_blocking_seconds();
  std::array<double, kCollectiveKindCount> waits{};
  for (std::size_t k = 0; k < waits.size(); ++k) waits[k] = group.take_exposed_wait(static_cast<CollectiveKind>(k));
  std::lock_guard lock(measured_mutex_);
  for (const auto& [purpose, seconds] : times) measured_[purpose] += seconds;
  blocking_seconds_ += blocking;
  for (std::size_t k = 0; k < waits.size(); ++k) exposed_wait_[k] += waits[k];
}

void mean_in_rank_order(std::span<const float* const> inputs, std::span<float> out) {
  // Rank by rank over the whole buffer, so each pass is one vectorizable loop; every element
  // still sees ((x_0 + x_1) + x_2) + ... and then / W, the order of the contract.
  const float w = static_cast<float>(inputs.size());
  float* __restrict acc = out.data();
  const std::size_t n = out.size();
  const auto out_begin = reinterpret_cast<std::uintptr_t>(acc), out_end = out_begin + n * sizeof(float);
  for (const float* x : inputs) {
    const auto in_begin = reinterpret_cast<std::uintptr_t>(x), in_end = in_begin + n * sizeof(float);
    if (n > 0 && in_begin < out_end && out_begin < in_end) {
      throw std::invalid_argument("mean_in_rank_order: the output overlaps an input");
    }
  }
  const float* __restrict first = inputs[0];
  for (std::size_t j = 0; j < n; ++j) acc[j] = first[j];
  for (std::size_t r = 1; r < inputs.size(); ++r) {
    const float* __restrict x = inputs[r];
    for (std::size_t j = 0; j < n; ++j) acc[j] += x[j];
  }
  for (std::size_t j = 0; j < n; ++j) acc[j] /= w;
}

}  // namespace scape
