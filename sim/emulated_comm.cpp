// Threads-as-ranks communicator with deterministic rank-order reductions.
#include "sim/emulated_comm.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>
#include <string>
#include <thread>

#include <omp.h>

namespace scape::sim {

EmulatedGroup::EmulatedGroup(int workers) : workers_(workers) {
  if (workers < 1) throw std::invalid_argument("EmulatedGroup: workers must be >= 1, got " + std::to_string(workers));
  slots_.resize(static_cast<std::size_t>(workers));
}

void EmulatedGroup::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  if (aborted_) throw CommAborted();
  const std::size_t gen = generation_;
  if (++arrived_ == workers_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) throw CommAborted();
}

void EmulatedGroup::abort() noexcept {
  std::vector<EmulatedGroup*> children;
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
    for (const auto& c : children_) children.push_back(c.get());
  }
  for (EmulatedGroup* c : children) c->abort();
}

EmulatedGroup& EmulatedGroup::make_child(int workers) {
  auto child = std::make_unique<EmulatedGroup>(workers);
  child->parent_ = this;
  std::lock_guard lock(mutex_);
  if (aborted_) child->aborted_ = true;
  children_.push_back(std::move(child));
  return *children_.back();
}

namespace {

// The first half of a collective with counts: this rank's send buffer and counts go into its
// slot, and every rank waits until all have published theirs.
void publish_send(EmulatedGroup& group, int rank, const void* send, std::span<const std::size_t> counts) {
  auto& me = group.slot(rank);
  me.send = send;
  me.counts.assign(counts.begin(), counts.end());
  group.arrive_and_wait();
}

}  // namespace

EmulatedComm::EmulatedComm(EmulatedGroup& group, int rank, NetworkModel net, LinkClass link)
    : Communicator(rank, group.workers(), net, link), group_(group) {}

std::unique_ptr<Communicator> EmulatedComm::split(int color, LinkClass link, NetworkModel net) {
  if (color < 0) throw std::invalid_argument("split: color must be >= 0, got " + std::to_string(color));
  auto& me = group_.slot(rank());
  me.size = static_cast<std::size_t>(color);
  group_.arrive_and_wait();
  // The lowest rank of a color makes the child group; the others find it in its slot.
  int leader = -1, new_rank = 0, members = 0;
  for (int q = 0; q < size(); ++q) {
    if (group_.slot(q).size != me.size) continue;
    if (leader < 0) leader = q;
    if (q < rank()) ++new_rank;
    ++members;
  }
  if (leader == rank()) me.scratch = &group_.make_child(members);
  group_.arrive_and_wait();
  EmulatedGroup& child = *static_cast<EmulatedGroup*>(group_.slot(leader).scratch);
  group_.arrive_and_wait();  // every rank has read its child before the slots are reused
  return std::make_unique<EmulatedComm>(child, new_rank, net, link);
}

void EmulatedComm::publish(const void* send, std::span<const std::size_t> counts, const char* what) {
  publish_send(group_, rank(), send, counts);
  const auto& reference = group_.slot(0).counts;
  if (!std::equal(counts.begin(), counts.end(), reference.begin(), reference.end())) {
    throw std::invalid_argument(std::string(what) + ": rank " + std::to_string(rank()) +
                                " passed counts that differ from rank 0's");
  }
}

void EmulatedComm::do_all_reduce_mean(std::span<float> data) {
  // Rank r reduces chunk r of the buffer into its own scratch; then every rank copies all
  // chunks back. Work is O(W N) in total, as in a ring, and each element's sum is in rank order.
  const int w = size();
  const std::size_t n = data.size();
  const std::size_t r = static_cast<std::size_t>(rank());
  const std::size_t lo = n * r / static_cast<std::size_t>(w);
  const std::size_t hi = n * (r + 1) / static_cast<std::size_t>(w);
  chunk_.resize(hi - lo);
  auto& me = group_.slot(rank());
  me.send = data.data();
  me.scratch = chunk_.data();
  me.size = n;
  group_.arrive_and_wait();
  for (int q = 0; q < w; ++q) {
    if (group_.slot(q).size != n) {
      throw std::invalid_argument("all_reduce: rank " + std::to_string(q) + " reduces " +
                                  std::to_string(group_.slot(q).size) + " elements, rank " +
                                  std::to_string(rank()) + " reduces " + std::to_string(n));
    }
  }
  std::vector<const float*> inputs(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) inputs[static_cast<std::size_t>(q)] = static_cast<const float*>(group_.slot(q).send) + lo;
  mean_in_rank_order(inputs, chunk_);
  group_.arrive_and_wait();
  for (int q = 0; q < w; ++q) {
    const std::size_t qlo = n * static_cast<std::size_t>(q) / static_cast<std::size_t>(w);
    const std::size_t qhi = n * static_cast<std::size_t>(q + 1) / static_cast<std::size_t>(w);
    if (qhi > qlo) std::memcpy(data.data() + qlo, group_.slot(q).scratch, (qhi - qlo) * sizeof(float));
  }
  group_.arrive_and_wait();
}

void EmulatedComm::do_reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                                          std::span<const std::size_t> counts) {
  const int w = size();
  publish(send.data(), counts, "reduce_scatter");
  const std::size_t offset = std::accumulate(counts.begin(), counts.begin() + rank(), std::size_t{0});
  std::vector<const float*> inputs(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q)
    inputs[static_cast<std::size_t>(q)] = static_cast<const float*>(group_.slot(q).send) + offset;
  mean_in_rank_order(inputs, recv);
  group_.arrive_and_wait();
}

void EmulatedComm::do_all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                       std::span<const std::size_t> counts) {
  const int w = size();
  publish(send.data(), counts, "all_gather");
  std::size_t offset = 0;
  for (int q = 0; q < w; ++q) {
    const std::size_t c = counts[static_cast<std::size_t>(q)];
    if (c > 0) std::memcpy(recv.data() + offset, group_.slot(q).send, c);
    offset += c;
  }
  group_.arrive_and_wait();
}

void EmulatedComm::do_all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                       std::span<const std::size_t> counts) {
  const int w = size();
  publish(send.data(), counts, "all_to_all");
  const std::size_t mine = counts[static_cast<std::size_t>(rank())];
  const std::size_t offset = std::accumulate(counts.begin(), counts.begin() + rank(), std::size_t{0});
  for (int q = 0; q < w; ++q) {
    if (mine > 0) {
      std::memcpy(recv.data() + static_cast<std::size_t>(q) * mine,
                  static_cast<const std::byte*>(group_.slot(q).send) + offset, mine);
    }
  }
  group_.arrive_and_wait();
}

std::unique_ptr<AsyncRequest> EmulatedComm::do_all_gather_bytes_async(std::span<const std::byte> send,
                                                                      std::span<std::byte> recv,
                                                                      std::span<const std::size_t> counts) {
  std::vector<std::size_t> own_counts(counts.begin(), counts.end());
  return std::make_unique<DeferredCollective>([this, send, recv, own_counts] {
    do_all_gather_bytes(send, recv, own_counts);
  });
}

void EmulatedComm::do_barrier() { group_.arrive_and_wait(); }

void EmulatedComm::abort() noexcept { group_.root().abort(); }

void run_ranks(int workers, const NetworkModel& net, const std::function<void(Communicator&)>& fn, LinkClass link) {
  EmulatedGroup group(workers);
  run_rank_threads(group, [&](int r) {
    EmulatedComm comm(group, r, net, link);
    fn(comm);
  });
}

void run_rank_threads(EmulatedGroup& group, const std::function<void(int rank)>& fn) {
  const int workers = group.workers();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
  std::vector<char> aborted(static_cast<std::size_t>(workers), 0);  // not vector<bool>: written concurrently
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers));
  // Rank threads share the cores: each gets its slice of the OpenMP threads, because nested
  // teams of spinning OpenMP threads on oversubscribed cores slow everything down many times.
  const int omp_threads = std::max(1, omp_get_max_threads() / workers);
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(omp_threads);
      try {
        fn(r);
      } catch (const CommAborted&) {
        aborted[static_cast<std::size_t>(r)] = 1;
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        group.abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (char a : aborted) {
    if (a) throw CommAborted();
  }
}

}  // namespace scape::sim

