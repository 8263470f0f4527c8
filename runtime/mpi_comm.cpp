// MpiComm (docs/runtime.md): MPI collectives behind the Communicator front end.
#include "runtime/mpi_comm.hpp"

#include <chrono>
#include <future>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "runtime/mpi_check.hpp"

namespace scape::runtime {
namespace {

int rank_of(MPI_Comm c) {
  int r = 0;
  SCAPE_MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}

int size_of(MPI_Comm c) {
  int s = 0;
  SCAPE_MPI_CHECK(MPI_Comm_size(c, &s));
  return s;
}

std::vector<int> int_counts(std::span<const std::size_t> counts, const char* what) {
  std::vector<int> out(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) out[i] = to_mpi_count(counts[i], what);
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

}  // namespace

int to_mpi_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) + " elements exceed MPI's int counts");
  }
  return static_cast<int>(n);
}

MpiComm::MpiComm(MPI_Comm world, NetworkModel net, MpiOptions options, LinkClass link)
    : Communicator(rank_of(world), size_of(world), net, link), world_(world), options_(options) {
  SCAPE_MPI_CHECK(MPI_Comm_dup(world_, &async_comm_));
  comm_thread_ = std::thread([this] { comm_thread_main(); });
}

MpiComm::~MpiComm() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  comm_thread_.join();
  if (parent_ != nullptr) parent_->blocked_.disown(blocked_);
  // A destructor cannot throw; a failure here leaves only a communicator unfreed.
  (void)MPI_Comm_free(&async_comm_);
  if (owns_world_) (void)MPI_Comm_free(&world_);
}

std::unique_ptr<Communicator> MpiComm::split(int color, LinkClass link, NetworkModel net) {
  if (color < 0) throw std::invalid_argument("split: color must be >= 0, got " + std::to_string(color));
  MPI_Comm group = MPI_COMM_NULL;
  {
    const BlockedClock::Scope blocked(blocked_);
    SCAPE_MPI_CHECK(MPI_Comm_split(world_, color, rank(), &group));
  }
  auto child = std::make_unique<MpiComm>(group, net, options_, link);
  child->owns_world_ = true;
  child->parent_ = this;
  blocked_.adopt(child->blocked_);
  return child;
}

void MpiComm::comm_thread_main() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(queue_mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void MpiComm::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(queue_mutex_);
    queue_.push_back(std::move(task));
  }
  queue_cv_.notify_one();
}

void MpiComm::reduce_scatter_on(MPI_Comm comm, std::span<const float> send, std::span<float> recv,
                                std::span<const std::size_t> counts, std::vector<float>& gathered) const {
  const int w = size();
  if (!options_.deterministic) {
    const auto c = int_counts(counts, "reduce_scatter");
    SCAPE_MPI_CHECK(MPI_Reduce_scatter(send.data(), recv.data(), c.data(), MPI_FLOAT, MPI_SUM, comm));
    const float wf = static_cast<float>(w);
    for (float& x : recv) x /= wf;
    return;
  }
  // Rank r receives every rank's segment r, then sums them in rank order like EmulatedComm.
  const std::size_t mine = counts[static_cast<std::size_t>(rank())];
  gathered.resize(mine * static_cast<std::size_t>(w));
  const auto send_counts = int_counts(counts, "reduce_scatter");
  const auto send_displs = displacements(send_counts);
  std::vector<int> recv_counts(static_cast<std::size_t>(w), to_mpi_count(mine, "reduce_scatter"));
  const auto recv_displs = displacements(recv_counts);
  SCAPE_MPI_CHECK(MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_FLOAT, gathered.data(),
                                recv_counts.data(), recv_displs.data(), MPI_FLOAT, comm));
  std::vector<const float*> inputs(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q)
    inputs[static_cast<std::size_t>(q)] = gathered.data() + static_cast<std::size_t>(q) * mine;
  mean_in_rank_order(inputs, recv);
}

void MpiComm::do_all_reduce_mean(std::span<float> data) {
  const int w = size();
  if (!options_.deterministic) {
    {
      const BlockedClock::Scope blocked(blocked_);
      const int count = to_mpi_count(data.size(), "all_reduce");
      SCAPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, world_));
    }
    const float wf = static_cast<float>(w);
    for (float& x : data) x /= wf;
    return;
  }
  // The chunks EmulatedComm uses: [n r / W, n (r+1) / W).
  const std::size_t n = data.size();
  std::vector<std::size_t> counts(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) {
    counts[static_cast<std::size_t>(q)] = n * static_cast<std::size_t>(q + 1) / static_cast<std::size_t>(w) -
                                          n * static_cast<std::size_t>(q) / static_cast<std::size_t>(w);
  }
  std::vector<float> chunk(counts[static_cast<std::size_t>(rank())]);
  const auto c = int_counts(counts, "all_reduce");
  const auto d = displacements(c);
  const BlockedClock::Scope blocked(blocked_);
  reduce_scatter_on(world_, data, chunk, counts, gathered_);
  SCAPE_MPI_CHECK(MPI_Allgatherv(chunk.data(), c[static_cast<std::size_t>(rank())], MPI_FLOAT, data.data(), c.data(),
                                 d.data(), MPI_FLOAT, world_));
}

void MpiComm::do_reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                                     std::span<const std::size_t> counts) {
  const BlockedClock::Scope blocked(blocked_);
  reduce_scatter_on(world_, send, recv, counts, gathered_);
}

void MpiComm::do_all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                  std::span<const std::size_t> counts) {
  const auto c = int_counts(counts, "all_gather");
  const auto d = displacements(c);
  const BlockedClock::Scope blocked(blocked_);
  SCAPE_MPI_CHECK(MPI_Allgatherv(send.data(), c[static_cast<std::size_t>(rank())], MPI_BYTE, recv.data(), c.data(),
                                 d.data(), MPI_BYTE, world_));
}

void MpiComm::do_all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                  std::span<const std::size_t> counts) {
  const auto send_counts = int_counts(counts, "all_to_all");
  const auto send_displs = displacements(send_counts);
  const int mine = send_counts[static_cast<std::size_t>(rank())];
  const std::vector<int> recv_counts(static_cast<std::size_t>(size()), mine);
  const auto recv_displs = displacements(recv_counts);
  const BlockedClock::Scope blocked(blocked_);
  SCAPE_MPI_CHECK(MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_BYTE, recv.data(),
                                recv_counts.data(), recv_displs.data(), MPI_BYTE, world_));
}

// A collective run on the communication thread; wait() blocks the caller only for what is left
// of it and records that wait as exposed, and the collective's own duration under `measured`.
class MpiComm::AsyncCollective final : public AsyncRequest {
 public:
  AsyncCollective(MpiComm& comm, CollectiveKind kind, std::string measured, std::future<double> done)
      : comm_(comm), kind_(kind), measured_(std::move(measured)), done_(std::move(done)) {}
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    double duration = 0;
    {
      const BlockedClock::Scope blocked(comm_.blocked_);
      duration = done_.get();  // rethrows the collective's error
    }
    comm_.add_exposed_wait(kind_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    comm_.add_measured_time(measured_, duration);
  }

 private:
  MpiComm& comm_;
  CollectiveKind kind_;
  std::string measured_;
  std::future<double> done_;
};

std::unique_ptr<AsyncRequest> MpiComm::run_async(CollectiveKind kind, std::string measured,
                                                 std::function<void()> collective) {
  auto promise = std::make_shared<std::promise<double>>();
  std::future<double> done = promise->get_future();
  enqueue([collective = std::move(collective), promise] {
    // An error must not escape the communication thread: wait() rethrows it on the caller's.
    try {
      const auto start = std::chrono::steady_clock::now();
      collective();
      promise->set_value(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  });
  return std::make_unique<AsyncCollective>(*this, kind, std::move(measured), std::move(done));
}

std::unique_ptr<AsyncRequest> MpiComm::do_all_gather_bytes_async(std::span<const std::byte> send,
                                                                 std::span<std::byte> recv,
                                                                 std::span<const std::size_t> counts) {
  auto c = int_counts(counts, "all_gather");
  auto d = displacements(c);
  const int mine = c[static_cast<std::size_t>(rank())];
  return run_async(CollectiveKind::all_gather, "async_all_gather",
                   [this, send, recv, c = std::move(c), d = std::move(d), mine] {
                     SCAPE_MPI_CHECK(MPI_Allgatherv(send.data(), mine, MPI_BYTE, recv.data(), c.data(), d.data(),
                                                    MPI_BYTE, async_comm_));
                   });
}

std::unique_ptr<AsyncRequest> MpiComm::do_reduce_scatter_mean_async(std::span<const float> send,
                                                                    std::span<float> recv,
                                                                    std::span<const std::size_t> counts) {
  std::vector<std::size_t> own_counts(counts.begin(), counts.end());
  return run_async(CollectiveKind::reduce_scatter, "async_reduce_scatter", [this, send, recv, own_counts] {
    reduce_scatter_on(async_comm_, send, recv, own_counts, async_gathered_);
  });
}

void MpiComm::do_barrier() {
  const BlockedClock::Scope blocked(blocked_);
  SCAPE_MPI_CHECK(MPI_Barrier(world_));
}

}  // namespace scape::runtime
