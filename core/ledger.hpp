// Byte ledger and alpha-beta time model of the collectives (docs/algorithms.md,
// "Communication volume"). Every communicator backend records through this one place, so
// the simulator, the MPI runtime and the predictor count bytes identically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace scape {

enum class CollectiveKind { all_reduce, reduce_scatter, all_gather, all_to_all };
// How many kinds there are: the size of every table indexed by CollectiveKind.
inline constexpr std::size_t kCollectiveKindCount = 4;
const char* to_string(CollectiveKind kind);

// The link a collective crosses: inside one node (NVLink), or between nodes (the network). A
// communicator whose ranks share one node records intra, any other inter (the class its group
// spans; docs/algorithms.md, "Hierarchy").
enum class LinkClass { intra, inter };
const char* to_string(LinkClass link);

// Per-worker link: latency alpha (seconds per message step) and bandwidth (bytes per second).
struct NetworkModel {
  double alpha_s = 0.0;
  double bandwidth_Bps = std::numeric_limits<double>::infinity();
};

// Ring closed forms for a collective over `payload_bytes` bytes in total among W workers.
double ring_bytes_sent_per_worker(CollectiveKind kind, int workers, double payload_bytes);
int ring_latency_steps(CollectiveKind kind, int workers);
// T = steps * alpha + bytes_sent_per_worker / B.
double alpha_beta_time(CollectiveKind kind, int workers, double payload_bytes, const NetworkModel& net);

// One collective call as the ledger saw it.
struct CommRecord {
  std::string purpose;           // e.g. "grad_reduce_scatter", "mask_all_gather"
  CollectiveKind kind = CollectiveKind::all_reduce;
  std::uint64_t payload_bytes = 0;  // n: total bytes of the collective at wire width
  double bytes_sent_per_worker = 0;
  int latency_steps = 0;
  double modelled_time_s = 0;
  bool overlapped = false;       // started asynchronously to hide behind compute
  bool in_backward = false;      // a bucket of the gradient reduction issued during the backward pass
  LinkClass link = LinkClass::inter;  // the link class of the communicator that recorded it
};

struct CommTotals {
  std::uint64_t calls = 0;
  std::uint64_t payload_bytes = 0;
  double bytes_sent_per_worker = 0;
  double modelled_time_s = 0;
};

class ByteLedger {
 public:
  // `link`: the class every record of this ledger is charged to.
  ByteLedger(int workers, NetworkModel net, LinkClass link = LinkClass::inter);

  void record(CollectiveKind kind, std::string_view purpose, std::uint64_t payload_bytes, bool overlapped);
  // A bucket of the gradient reduction, issued as soon as the backward pass has finished its
  // part of the gradient (optimizer.overlap_grad_reduce); buckets are recorded in issue order.
  void record_backward_bucket(CollectiveKind kind, std::string_view purpose, std::uint64_t payload_bytes);

  // Records since the last drain (an optimizer step drains them into its metrics).
  std::vector<CommRecord> drain();
  // How many records wait for the next drain; mark_overlapped flags those from the first-th on
  // as overlapped: collectives whose result the caller applies one step later, so that they
  // hide behind that step's compute (DiLoCo's overlap_outer).
  std::size_t pending_records() const { return pending_.size(); }
  void mark_overlapped(std::size_t first);
  // Cumulative totals per purpose since construction.
  const std::map<std::string, CommTotals>& totals() const { return totals_; }
  const NetworkModel& network() const { return net_; }
  int workers() const { return workers_; }
  LinkClass link() const { return link_; }

 private:
  int workers_;
  NetworkModel net_;
  LinkClass link_;
  std::vector<CommRecord> pending_;
  std::map<std::string, CommTotals> totals_;
};

// Sum of a step's records: bytes sent per worker and modelled time, split into what is
// exposed, what overlaps compute (the lagged mask all-gather) and the buckets issued during
// the backward pass.
struct CommSummary {
  double bytes_sent_per_worker = 0;
  double modelled_time_s = 0;
  double exposed_time_s = 0;
  double overlapped_time_s = 0;
  double backward_bucket_time_s = 0;
};
CommSummary summarize(const std::vector<CommRecord>& records);
// Bytes sent per worker by the records of one link class.
double bytes_sent_on(const std::vector<CommRecord>& records, LinkClass link);

// Exposed seconds of the backward-pass buckets among `records` (docs/algorithms.md, "Modelled
// step time"): bucket i is ready once the backward pass, of `backward_s` seconds, has covered
// the buckets' payload up to and including i (backward time taken as proportional to the
// parameters it produces), starts when it is ready and the link has finished bucket i-1, and
// whatever ends after the backward pass is exposed. For B equal buckets of total time T this is
// max(T / B, T - backward_s (B - 1) / B).
double backward_buckets_exposed(const std::vector<CommRecord>& records, double backward_s);

// The modelled step: compute + exposed + the backward buckets' exposed part + what of the
// overlapped collectives (the lagged mask all-gather) exceeds the compute the buckets leave the
// link. The backward pass is taken as 2/3 of the compute (forward : backward = 1 : 2 FLOPs).
double modelled_step_time(const std::vector<CommRecord>& records, double compute_s);

}  // namespace scape
