// Byte ledger and alpha-beta model (docs/algorithms.md, "Communication volume").
#include "core/ledger.hpp"

#include <algorithm>
#include <stdexcept>

#include "util/name_table.hpp"

namespace scape {

constexpr EnumName<CollectiveKind> kCollectiveKinds[] = {{"all_reduce", CollectiveKind::all_reduce},
                                                         {"reduce_scatter", CollectiveKind::reduce_scatter},
                                                         {"all_gather", CollectiveKind::all_gather},
                                                         {"all_to_all", CollectiveKind::all_to_all}};
static_assert(std::size(kCollectiveKinds) == kCollectiveKindCount,
              "a table indexed by CollectiveKind would miss a kind");

const char* to_string(CollectiveKind kind) { return name_of(kCollectiveKinds, kind); }

double ring_bytes_sent_per_worker(CollectiveKind kind, int workers, double payload_bytes) {
  if (workers < 1) throw std::invalid_argument("ring_bytes_sent_per_worker: workers must be >= 1");
  const double w = workers;
  const double fraction = (w - 1.0) / w;
  // A ring all-reduce is a reduce-scatter followed by an all-gather, hence the factor 2. An
  // all-to-all sends every segment but its own: (W-1)/W of its payload, in W-1 exchanges.
  return kind == CollectiveKind::all_reduce ? 2.0 * fraction * payload_bytes : fraction * payload_bytes;
}

int ring_latency_steps(CollectiveKind kind, int workers) {
  if (workers < 1) throw std::invalid_argument("ring_latency_steps: workers must be >= 1");
  return kind == CollectiveKind::all_reduce ? 2 * (workers - 1) : workers - 1;
}

double alpha_beta_time(CollectiveKind kind, int workers, double payload_bytes, const NetworkModel& net) {
  const double sent = ring_bytes_sent_per_worker(kind, workers, payload_bytes);
  const double bandwidth_term = sent > 0 ? sent / net.bandwidth_Bps : 0.0;
  return ring_latency_steps(kind, workers) * net.alpha_s + bandwidth_term;
}

const char* to_string(LinkClass link) { return link == LinkClass::intra ? "intra" : "inter"; }

ByteLedger::ByteLedger(int workers, NetworkModel net, LinkClass link) : workers_(workers), net_(net), link_(link) {
  if (workers < 1) throw std::invalid_argument("ByteLedger: workers must be >= 1");
  if (!(net.alpha_s >= 0)) throw std::invalid_argument("NetworkModel: alpha_s must be >= 0");
  if (!(net.bandwidth_Bps > 0)) throw std::invalid_argument("NetworkModel: bandwidth_Bps must be > 0");
}

void ByteLedger::record(CollectiveKind kind, std::string_view purpose, std::uint64_t payload_bytes,
                        bool overlapped) {
  CommRecord r;
  r.purpose = std::string(purpose);
  r.kind = kind;
  r.payload_bytes = payload_bytes;
  r.bytes_sent_per_worker = ring_bytes_sent_per_worker(kind, workers_, static_cast<double>(payload_bytes));
  r.latency_steps = ring_latency_steps(kind, workers_);
  r.modelled_time_s = alpha_beta_time(kind, workers_, static_cast<double>(payload_bytes), net_);
  r.overlapped = overlapped;
  r.link = link_;
  CommTotals& t = totals_[r.purpose];
  t.calls += 1;
  t.payload_bytes += payload_bytes;
  t.bytes_sent_per_worker += r.bytes_sent_per_worker;
  t.modelled_time_s += r.modelled_time_s;
  pending_.push_back(std::move(r));
}

void ByteLedger::record_backward_bucket(CollectiveKind kind, std::string_view purpose, std::uint64_t payload_bytes) {
  record(kind, purpose, payload_bytes, false);
  pending_.back().in_backward = true;
}

void ByteLedger::mark_overlapped(std::size_t first) {
  for (std::size_t i = first; i < pending_.size(); ++i) pending_[i].overlapped = true;
}

std::vector<CommRecord> ByteLedger::drain() {
  std::vector<CommRecord> out;
  out.swap(pending_);
  return out;
}

CommSummary summarize(const std::vector<CommRecord>& records) {
  CommSummary s;
  for (const auto& r : records) {
    s.bytes_sent_per_worker += r.bytes_sent_per_worker;
    s.modelled_time_s += r.modelled_time_s;
    if (r.in_backward) {
      s.backward_bucket_time_s += r.modelled_time_s;
    } else {
      (r.overlapped ? s.overlapped_time_s : s.exposed_time_s) += r.modelled_time_s;
    }
  }
  return s;
}

double bytes_sent_on(const std::vector<CommRecord>& records, LinkClass link) {
  double sent = 0;
  for (const auto& r : records) {
    if (r.link == link) sent += r.bytes_sent_per_worker;
  }
  return sent;
}

double backward_buckets_exposed(const std::vector<CommRecord>& records, double backward_s) {
  double payload = 0;
  for (const auto& r : records) {
    if (r.in_backward) payload += static_cast<double>(r.payload_bytes);
  }
  if (!(payload > 0)) return 0.0;
  double covered = 0, link_free = 0;
  for (const auto& r : records) {
    if (!r.in_backward) continue;
    covered += static_cast<double>(r.payload_bytes);
    const double ready = backward_s * covered / payload;
    link_free = std::max(link_free, ready) + r.modelled_time_s;
  }
  return std::max(0.0, link_free - backward_s);
}

double modelled_step_time(const std::vector<CommRecord>& records, double compute_s) {
  const CommSummary s = summarize(records);
  const double bucket_exposed = backward_buckets_exposed(records, compute_s * 2.0 / 3.0);
  const double link_busy = s.backward_bucket_time_s - bucket_exposed;
  return compute_s + s.exposed_time_s + bucket_exposed +
         std::max(0.0, s.overlapped_time_s - std::max(0.0, compute_s - link_busy));
}

}  // namespace scape
