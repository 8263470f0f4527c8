// TransportComm: the six backend hooks over a caller's transport.
#include "runtime/transport_comm.hpp"

#include <numeric>

namespace scape::runtime {
namespace {

std::span<const std::byte> as_bytes(std::span<const float> v) { return std::as_bytes(v); }
std::span<std::byte> as_writable(std::span<float> v) { return std::as_writable_bytes(v); }

std::vector<std::size_t> times_four(std::span<const std::size_t> counts) {
  std::vector<std::size_t> out(counts.begin(), counts.end());
  for (auto& c : out) c *= sizeof(float);
  return out;
}

}  // namespace

TransportComm::TransportComm(CollectiveTransport& transport, NetworkModel net, bool deterministic)
    : Communicator(transport.rank(), transport.size(), net), transport_(transport), deterministic_(deterministic) {}

void TransportComm::reduce_scatter_in_rank_order(std::span<const float> send, std::span<float> recv,
                                                 std::span<const std::size_t> counts) {
  const auto w = static_cast<std::size_t>(size());
  const std::size_t mine = counts[static_cast<std::size_t>(rank())];
  gathered_.resize(mine * w);
  const std::vector<std::size_t> send_bytes = times_four(counts);
  const std::vector<std::size_t> recv_bytes(w, mine * sizeof(float));
  transport_.all_to_all_bytes(as_bytes(send), send_bytes, as_writable(std::span<float>(gathered_)), recv_bytes);
  std::vector<const float*> inputs(w);
  for (std::size_t q = 0; q < w; ++q) inputs[q] = gathered_.data() + q * mine;
  mean_in_rank_order(inputs, recv);
}

void TransportComm::do_all_reduce_mean(std::span<float> data) {
  const auto w = static_cast<std::size_t>(size());
  if (!deterministic_) {
    transport_.all_reduce_sum(data);
    const float wf = static_cast<float>(w);
    for (float& x : data) x /= wf;
    return;
  }
  // The chunks EmulatedComm and MpiComm use: [n r / W, n (r+1) / W).
  const std::size_t n = data.size();
  std::vector<std::size_t> counts(w);
  for (std::size_t q = 0; q < w; ++q) counts[q] = n * (q + 1) / w - n * q / w;
  std::vector<float> chunk(counts[static_cast<std::size_t>(rank())]);
  reduce_scatter_in_rank_order(data, chunk, counts);
  transport_.all_gather_bytes(as_bytes(chunk), as_writable(data), times_four(counts));
}

void TransportComm::do_reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                                           std::span<const std::size_t> counts) {
  if (deterministic_) {
    reduce_scatter_in_rank_order(send, recv, counts);
    return;
  }
  std::vector<float> sum(send.begin(), send.end());
  transport_.all_reduce_sum(sum);
  const std::size_t begin =
      std::accumulate(counts.begin(), counts.begin() + rank(), std::size_t{0});
  const float wf = static_cast<float>(size());
  for (std::size_t j = 0; j < recv.size(); ++j) recv[j] = sum[begin + j] / wf;
}

void TransportComm::do_all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                        std::span<const std::size_t> counts) {
  transport_.all_gather_bytes(send, recv, counts);
}

// The lagged mask's all-gather runs when it is waited for: every rank waits at the same point of
// its step, so the order of collectives is the same on every rank (no overlap with compute).
std::unique_ptr<AsyncRequest> TransportComm::do_all_gather_bytes_async(std::span<const std::byte> send,
                                                                       std::span<std::byte> recv,
                                                                       std::span<const std::size_t> counts) {
  std::vector<std::size_t> copy(counts.begin(), counts.end());
  return std::make_unique<DeferredCollective>(
      [this, send, recv, copy = std::move(copy)] { transport_.all_gather_bytes(send, recv, copy); });
}

void TransportComm::do_all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                        std::span<const std::size_t> counts) {
  const std::vector<std::size_t> recv_counts(static_cast<std::size_t>(size()),
                                             counts[static_cast<std::size_t>(rank())]);
  transport_.all_to_all_bytes(send, counts, recv, recv_counts);
}

void TransportComm::do_barrier() { transport_.barrier(); }

void gather_bytes(CollectiveTransport& transport, int root, std::span<const std::byte> send,
                  std::span<std::byte> recv, std::span<const std::size_t> counts) {
  const auto w = static_cast<std::size_t>(transport.size());
  const bool is_root = transport.rank() == root;
  std::vector<std::size_t> send_counts(w, 0), recv_counts(w, 0);
  send_counts[static_cast<std::size_t>(root)] = send.size();
  if (is_root) recv_counts.assign(counts.begin(), counts.end());
  transport.all_to_all_bytes(send, send_counts, is_root ? recv : std::span<std::byte>{}, recv_counts);
}

}  // namespace scape::runtime
