// Step time: compute, collectives on the two-level network, overlap, optimizer step
// (docs/PREDICTING.md, "Step time" and "Optimizer step").
#include "predict/step_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/layout.hpp"
#include "core/schedule.hpp"
#include "optimizers/rail_partition.hpp"
#include "optimizers/volume.hpp"

namespace scape::predict {
namespace {

// Bytes per element of the optimizer kernels, fp32 state (docs/PREDICTING.md, "Optimizer step").
constexpr double kAdamSStep = 20;     // read g, theta, m; write theta, m
constexpr double kAdamWExtra = 8;     // read and write v
constexpr double kAccumulate = 12;    // a = e + g: read e, g; write e
constexpr double kSelect = 20;        // statistic (read a, m; write s) and two top-k passes over s
constexpr double kTopkSelect = 8;     // top-k of |a|: two passes over a
constexpr double kPack = 16;          // per mask coordinate: index, a (and m), write b; zero e
constexpr double kReadWrite = 8;      // read and write one value (weight decay, divide by W)
constexpr double kMaskedStep = 44;    // reconstruct g (idx, b, m -> g) and the indexed AdamS step
constexpr double kIndexedMove = 12;   // index, value, destination (compact, expand, sum pairs)
constexpr double kClear = 4;          // write one value

bool dense_type(const OptimizerConfig& c) { return c.type == OptimizerType::adamw || c.type == OptimizerType::adams; }
bool adamw_rule(const OptimizerConfig& c) {
  return c.type == OptimizerType::adamw || (!dense_type(c) && c.inner == InnerRule::adamw);
}
double dense_step_bytes(const OptimizerConfig& c) { return kAdamSStep + (adamw_rule(c) ? kAdamWExtra : 0); }

// Elements of optimizer state one GPU steps: its shard (the first, never shorter) or all N.
double state_elements(const OptimizerConfig& c, std::uint64_t n, int workers) {
  return c.sharded ? static_cast<double>(Sharding(n, workers).size(0)) : static_cast<double>(n);
}

OptimizerBytes scape_step_bytes(const OptimizerConfig& c, std::uint64_t n, int workers, std::uint64_t m) {
  const double nn = static_cast<double>(n);
  const double mm = static_cast<double>(m);
  const double state = state_elements(c, n, workers);
  // The mask coordinates this GPU updates: K / W on an owner (sharded), all of them otherwise.
  const double own = c.sharded ? std::ceil(mm / workers) : mm;
  const double ranked = c.scape.mask_partition == MaskPartition::partitioned
                            ? static_cast<double>(Sharding(n, workers).size(0))
                            : nn;
  OptimizerBytes b{kSelect * ranked, kPack * mm, kAccumulate * nn};
  if (c.scape.update == UpdateMode::dense) {
    b.state += kClear * state + kIndexedMove * own + dense_step_bytes(c) * state;
  } else {
    b.state += kReadWrite * nn + (kMaskedStep + (adamw_rule(c) ? kAdamWExtra : 0)) * own;
    if (c.sharded) b.state += kIndexedMove * (own + mm);  // compact the owned values, expand all
  }
  return b;
}

OptimizerBytes topk_step_bytes(const OptimizerConfig& c, std::uint64_t n, int workers, std::uint64_t k) {
  const double nn = static_cast<double>(n);
  const double kk = static_cast<double>(k);
  const double sum_pairs = kIndexedMove * workers * kk + (kClear + kReadWrite) * nn;  // zero, add, divide by W
  return OptimizerBytes{kTopkSelect * nn, kPack * kk, kAccumulate * nn + sum_pairs + dense_step_bytes(c) * nn};
}

// Residual offload: passes over the residual per step (one when the mask is known before the
// backward pass, lag 1; two otherwise) and the copies of each, up and down.
void add_offload(StepPrediction& s, const StepInputs& in) {
  const OptimizerConfig& c = in.optimizer;
  if (c.type != OptimizerType::scape || !c.residual_offload) return;
  const double n = static_cast<double>(in.n_params);
  const int passes = c.scape.mask_lag == 1 ? 1 : 2;
  const double chunks = std::ceil(n / static_cast<double>(c.offload_chunk));
  const double copy_s = 4.0 * n / in.gpu.host_link_Bps();
  // The kernels that stream the residual: accumulate, statistic and selection, packing.
  const double kernels_s = kAccumulate * n / in.gpu.memory_Bps() + s.select_s + s.pack_s;
  s.offload_s = passes * 2.0 * copy_s;
  s.offload_exposed_s = passes * double_buffered_exposed(copy_s, kernels_s / passes, chunks);
}

// Random-k: the shared draw (write N), its top-k, the mask values compacted and zeroed in e,
// then expanded into a cleared g_bar.
OptimizerBytes randk_step_bytes(const OptimizerConfig& c, std::uint64_t n, std::uint64_t k) {
  const double nn = static_cast<double>(n);
  const double kk = static_cast<double>(k);
  return OptimizerBytes{kTopkSelect * nn, kPack * kk,
                        (kAccumulate + kClear + kClear) * nn + kIndexedMove * kk + dense_step_bytes(c) * nn};
}

// 1-bit Adam after the freeze: the local momentum and error (read m, g, e; write c, e), the
// chunk norms and the sign pass over e (read; read and write), W expansions of this GPU's
// shard plus the server pass, the expansion of all of m, and AdamW's step (m replaced, v read);
// every pass streams, so all of it is state traffic at the memory bandwidth.
OptimizerBytes onebit_step_bytes(const OptimizerConfig& c, std::uint64_t n, int workers) {
  const double nn = static_cast<double>(n);
  const double shard = static_cast<double>(Sharding(n, workers).size(0));
  const double compress = 4 + kReadWrite;
  return OptimizerBytes{0, 0,
                        (kAccumulate + 4 + compress) * nn + (workers * kReadWrite + kAccumulate + compress) * shard +
                            (kClear + kReadWrite) * nn + dense_step_bytes(c) * nn};
}

// PowerSGD: the accumulate of e, two products reading M (P = M Q, Q = M^T P; the factors are
// small), the residual pass (read and write e, write the approximation) and the inner step;
// the products' r flops per element are left out (memory traffic only, as elsewhere).
OptimizerBytes powersgd_step_bytes(const OptimizerConfig& c, std::uint64_t n) {
  const double nn = static_cast<double>(n);
  return OptimizerBytes{0, 0, (kAccumulate + 4 + 4 + kAccumulate) * nn + dense_step_bytes(c) * nn};
}

// DeMo: the momentum update (scale, accumulate), the forward DCT and the per-chunk top-k, the
// extracted part expanded, inverted, negated and subtracted, the mean scattered and divided,
// the inverse DCT of the update, the weight decay and the sign step; the DCTs' chunk flops per
// element are left out.
OptimizerBytes demo_step_bytes(std::uint64_t n) {
  const double nn = static_cast<double>(n);
  const double transform = 8;
  return OptimizerBytes{(transform + 4) * nn, 0,
                        (kReadWrite + kAccumulate) * nn + (kClear + transform + kReadWrite + kAccumulate) * nn +
                            (kClear + kReadWrite + transform + kReadWrite + kAccumulate) * nn};
}

bool gradient_reduction(const std::string& purpose) {
  return purpose.rfind("grad_", 0) == 0 || purpose.rfind("accum_", 0) == 0;
}

Window window_for(const CommRecord& r, const OptimizerConfig& c, const OverlapModel& o) {
  if (r.overlapped) return o.mask_gather ? Window::compute : Window::none;
  if (r.purpose == "param_all_gather") return o.param_gather ? Window::forward : Window::none;
  if (gradient_reduction(r.purpose)) {
    // SCAPE can pack a bucket before the backward pass ends only when the mask is already known.
    const bool sparse = c.type == OptimizerType::scape && c.scape.mask_lag == 1 && o.sparse_reduce;
    if ((dense_type(c) && o.grad_reduce) || sparse) return Window::backward;
  }
  return Window::none;
}

std::optional<std::size_t> union_size(const OptimizerConfig& c, std::uint64_t n, int workers, double fill_in,
                                      std::size_t k) {
  if (c.type != OptimizerType::scape || c.scape.mask_partition != MaskPartition::local_union) return std::nullopt;
  const double upper = std::min(static_cast<double>(n), static_cast<double>(workers) * static_cast<double>(k));
  const double m = std::clamp(std::round(fill_in * static_cast<double>(k)), static_cast<double>(k), upper);
  return static_cast<std::size_t>(m);
}

// optimizer.hierarchy = "node" (docs/PREDICTING.md, "Hierarchy"): the node's collectives run
// among its g GPUs on the node's links alone; a rail's run among the M nodes, one GPU each, the g
// rails at once on the node's ports (each GPU its share of them, as the flat rings' rails).
Topology node_topology(const Topology& topo) {
  Topology node = topo;
  node.inter_by_kind = {};
  return node;
}

Topology rail_topology(const Topology& topo, const Placement& p) {
  Topology rail;
  rail.gpus_per_node = 1;
  rail.nics_per_node = 1;
  rail.intra = topo.intra;
  for (std::size_t k = 0; k < kCollectiveKindCount; ++k) {
    rail.inter_by_kind[k] = inter_link_per_gpu(topo, p, static_cast<CollectiveKind>(k));
  }
  rail.inter = topo.inter;
  // A rail's GPU sends its bytes through its share of the port, which carries the other rails'
  // at once: the port's full-rate bytes are that share of the GPU's.
  if (topo.inter_curves) {
    rail.inter_curves = topo.inter_curves;
    rail.inter_curves->rate_scale *= port_share(topo, p);
  }
  return rail;
}

// What the inter link did before each of a step's collectives (predict/link_load.hpp): the
// first one across nodes finds it idle, left so by the forward and backward passes; every later
// one follows another, and so does the lagged mask all-gather, issued right behind the step's
// last. All busy (one regime) when the topology has no inter_curves.
std::vector<LinkLoad> link_loads(const std::vector<CommRecord>& records, const StepInputs& in) {
  std::vector<LinkLoad> out(records.size(), LinkLoad::busy);
  if (!in.topology.inter_curves) return out;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const bool across = in.optimizer.hierarchy != Hierarchy::node || records[i].link == LinkClass::inter;
    if (across && !records[i].overlapped) {
      out[i] = LinkLoad::idle;
      break;
    }
  }
  return out;
}

CollectiveTime cost(const CommRecord& r, Window window, const StepInputs& in, int workers,
                    LinkLoad load = LinkLoad::busy) {
  CollectiveTime c;
  c.record = r;
  c.window = window;
  const double payload = static_cast<double>(r.payload_bytes);
  if (window == Window::forward || window == Window::backward) {
    const double bucket = in.overlap.bucket_MB * 1e6;
    c.buckets = std::max(1, static_cast<int>(std::ceil(payload / bucket)));
  }
  const double each = payload / c.buckets;
  Topology topo = in.topology;
  int ranks = workers;
  if (in.optimizer.hierarchy == Hierarchy::node) {
    const Placement p = place(in.topology, workers);
    const bool node = r.link == LinkClass::intra;
    topo = node ? node_topology(in.topology) : rail_topology(in.topology, p);
    ranks = node ? p.gpus_per_node : p.nodes;
  }
  const double busy = collective_time(r.kind, each, topo, ranks);
  // Only the first of its calls finds the link idle.
  c.time_s = load == LinkLoad::idle
                 ? collective_time(r.kind, each, topo, ranks, LinkLoad::idle) + (c.buckets - 1) * busy
                 : c.buckets * busy;
  const LinkBytes b = link_bytes_per_gpu(r.kind, each, topo, ranks);
  const bool across_nodes = in.optimizer.hierarchy == Hierarchy::node && r.link == LinkClass::inter;
  c.intra_bytes = c.buckets * (across_nodes ? 0.0 : b.intra);
  c.inter_bytes = c.buckets * (across_nodes ? b.intra + b.inter : b.inter);
  return c;
}

// Sets exposed_s of the collectives of one window: `exposed` of their total, shared in
// proportion to their times.
void share_exposed(std::vector<CollectiveTime>& cs, Window w, double total, double exposed) {
  for (auto& c : cs) {
    if (c.window == w) c.exposed_s = total > 0 ? exposed * c.time_s / total : 0.0;
  }
}

void apply_overlap(StepPrediction& s) {
  std::array<double, 4> total{};
  std::array<int, 4> buckets{};
  for (const auto& c : s.collectives) {
    total[static_cast<std::size_t>(c.window)] += c.time_s;
    buckets[static_cast<std::size_t>(c.window)] += c.buckets;
  }
  const auto at = [](auto& a, Window w) -> auto& { return a[static_cast<std::size_t>(w)]; };
  double busy = 0;  // link time already hidden inside the forward and backward passes
  for (const auto& [w, len] : {std::pair{Window::forward, s.forward_s}, std::pair{Window::backward, s.backward_s}}) {
    const double exposed = bucketed_exposed(at(total, w), std::max(1, at(buckets, w)), len);
    share_exposed(s.collectives, w, at(total, w), exposed);
    busy += at(total, w) - exposed;
  }
  // The lagged mask all-gather runs from the end of one step to the end of the next backward
  // pass, on a link that the bucketed collectives already use for `busy` of that time.
  const double free = std::max(0.0, s.compute_s() - busy);
  share_exposed(s.collectives, Window::compute, at(total, Window::compute),
                std::max(0.0, at(total, Window::compute) - free));
  for (auto& c : s.collectives) {
    if (c.window == Window::none) c.exposed_s = c.time_s;
  }
}

// Device bytes a coordinate of the synced fragment costs at an outer step: DiLoCo forms the
// pseudo-gradient (read theta_g, theta_i, write delta: 12), steps the Nesterov momentum and
// theta_g (read delta, b, theta_g, write b, theta_g: 20) and restarts theta_i (8); SparseLoCo
// forms delta (12), accumulates the error feedback (12), selects per chunk (kSelect), subtracts
// what it sent (8), steps theta_g by the mean of the W messages (12 + W k / N indexed moves) and
// restarts theta_i (8).
constexpr double kDilocoOuter = 40;
constexpr double kSparselocoOuter = 12 + 12 + kSelect + 8 + 12 + 8;

// DiLoCo's and SparseLoCo's mean step over one outer period of H steps (docs/PREDICTING.md,
// "Local SGD"): every step pays the forward, backward and its inner AdamW or AdamS over all N
// coordinates; the outer steps of the period (one, or F of Streaming DiLoCo's fragments) pay
// their collectives and their outer update, each divided by H. Without overlap_outer an outer
// step waits for its collectives; with it they run beside the next inner step's forward and
// backward and only what outlasts them is exposed.
void add_outer_loop(StepPrediction& s, const StepInputs& in, int workers, std::uint64_t method_n) {
  const OptimizerConfig& c = in.optimizer;
  const int h = c.outer.inner_steps;
  const bool tensors = in.layout.size() > 0;
  const double per_step = 1.0 / h;
  double outer_bytes = 0;
  for (int t = h + 1; t <= 2 * h; ++t) {  // a whole period away from the first and the last step
    const auto records = tensors ? step_collectives(c, in.layout, workers, t, 2 * h + 1, in.topology.inter)
                                 : step_collectives(c, in.n_params, workers, t, 2 * h + 1, in.topology.inter);
    if (records.empty()) continue;
    std::vector<CollectiveTime> sync;
    double total = 0;
    const auto loads = link_loads(records, in);
    for (std::size_t i = 0; i < records.size(); ++i) {
      const CommRecord& r = records[i];
      sync.push_back(cost(r, r.overlapped ? Window::compute : Window::none, in, workers, loads[i]));
      total += sync.back().time_s;
    }
    const double exposed = c.outer.overlap_outer ? std::max(0.0, total - s.compute_s()) : total;
    for (auto& col : sync) {
      col.exposed_s = total > 0 ? exposed * col.time_s / total : 0.0;
      auto same = std::find_if(s.collectives.begin(), s.collectives.end(),
                               [&](const CollectiveTime& x) { return x.record.purpose == col.record.purpose; });
      if (same == s.collectives.end()) {
        s.collectives.push_back(col);
        same = std::prev(s.collectives.end());
        same->time_s = same->exposed_s = same->intra_bytes = same->inter_bytes = 0;
        same->record.payload_bytes = 0;
        same->record.bytes_sent_per_worker = 0;
        same->buckets = 0;
      }
      same->time_s += col.time_s * per_step;
      same->exposed_s += col.exposed_s * per_step;
      same->intra_bytes += col.intra_bytes * per_step;
      same->inter_bytes += col.inter_bytes * per_step;
      same->record.payload_bytes += col.record.payload_bytes;  // the period's, divided below
      same->record.bytes_sent_per_worker += col.record.bytes_sent_per_worker * per_step;
      same->buckets += 1;
    }
    const double fragment =
        static_cast<double>(method_n) / (c.type == OptimizerType::diloco ? c.diloco.streaming_fragments : 1);
    outer_bytes += fragment * (c.type == OptimizerType::diloco
                                   ? kDilocoOuter
                                   : kSparselocoOuter + workers * kIndexedMove * (1.0 - c.sparsity));
  }
  for (auto& col : s.collectives) {
    col.record.payload_bytes = static_cast<std::uint64_t>(std::llround(col.record.payload_bytes * per_step));
  }
  s.optimizer_bytes += outer_bytes * per_step;
  s.state_s += outer_bytes * per_step / in.gpu.memory_Bps();
}

}  // namespace

const char* to_string(Window w) {
  switch (w) {
    case Window::none: return "none";
    case Window::forward: return "forward";
    case Window::backward: return "backward";
    case Window::compute: return "forward+backward";
  }
  return "unknown";
}

int steady_state_step(const OptimizerConfig& c) {
  // 1-bit Adam's steady state is compressed, after its dense warm-up.
  if (c.type == OptimizerType::onebit_adam) return c.onebit.freeze_step + 1;
  return std::max(2, c.density_warmup + 1);
}

OptimizerBytes optimizer_bytes_by_kernel(const OptimizerConfig& c, std::uint64_t n, int workers,
                                         std::uint64_t mask_size) {
  switch (c.type) {
    case OptimizerType::adamw:
    case OptimizerType::adams:
      return OptimizerBytes{0, 0, dense_step_bytes(c) * state_elements(c, n, workers)};
    case OptimizerType::scape:
      return scape_step_bytes(c, n, workers, mask_size);
    case OptimizerType::topk_ef:
      return topk_step_bytes(c, n, workers, mask_size);
    case OptimizerType::randk_ef:
      return randk_step_bytes(c, n, mask_size);
    case OptimizerType::onebit_adam:
      return onebit_step_bytes(c, n, workers);
    case OptimizerType::powersgd:
      return powersgd_step_bytes(c, n);
    case OptimizerType::demo:
      return demo_step_bytes(n);
    case OptimizerType::diloco:
    case OptimizerType::sparseloco:
      break;  // refused by the prediction config (predict/predict_config.cpp)
  }
  return {};
}

double optimizer_step_bytes(const OptimizerConfig& c, std::uint64_t n, int workers, std::uint64_t mask_size) {
  return optimizer_bytes_by_kernel(c, n, workers, mask_size).total();
}

double double_buffered_exposed(double copy_s, double kernel_s, double chunks) {
  if (!(copy_s > 0)) return 0.0;
  const double c = std::max(1.0, chunks);
  const double pass = (2 * copy_s + kernel_s) / c + (c - 1) * std::max(copy_s, kernel_s) / c;
  return std::max(0.0, pass - kernel_s);
}

namespace {

// Coding time of a mask of k among n coordinates (mask_codec_seconds); k is read only when the
// time comes from the kernels' bytes.
double codec_seconds(const OptimizerConfig& c, std::uint64_t n, int workers, const presets::GpuSpec& gpu,
                     std::size_t k) {
  if (c.type != OptimizerType::scape || c.scape.mask_partition != MaskPartition::partitioned ||
      c.mask_encoding == MaskEncoding::bitmap) {
    return 0.0;
  }
  const double coordinates = static_cast<double>(n);
  if (gpu.mask_codec_Gcoords_per_s > 0) {
    return 0.5 * (1.0 + 1.0 / workers) * coordinates / (gpu.mask_codec_Gcoords_per_s * 1e9);
  }
  // Decode: clear the mask (N/8) and set K positions (8 bytes each); encode of the own shard:
  // count, scan (read and write) and code passes over its words and their 8-byte offsets.
  const double bytes = coordinates / 8 + 8 * static_cast<double>(k) + 0.75 * coordinates / workers;
  return bytes / gpu.memory_Bps();
}

double steady_density(const OptimizerConfig& c) { return density_at(c.density_schedule(), steady_state_step(c)); }

}  // namespace

double mask_codec_seconds(const OptimizerConfig& c, std::uint64_t n, int workers, const presets::GpuSpec& gpu) {
  return codec_seconds(c, n, workers, gpu, mask_k(c, n, workers, steady_density(c)));
}

double mask_codec_seconds(const OptimizerConfig& c, const ParamLayout& layout, int workers,
                          const presets::GpuSpec& gpu) {
  return codec_seconds(c, layout.size(), workers, gpu, mask_k(c, layout, workers, steady_density(c)));
}

double bucketed_exposed(double time_s, int buckets, double window_s) {
  if (!(time_s > 0)) return 0.0;
  const double b = std::max(1, buckets);
  return std::max(time_s / b, time_s - window_s * (b - 1) / b);
}

MethodShare method_share(const OptimizerConfig& c, const ParamLayout& layout, std::uint64_t n_params, int workers,
                         int gpus_per_node) {
  MethodShare m{c, layout, n_params, workers, 0};
  if (c.hierarchy != Hierarchy::node) return m;
  const auto parts = split_into_rails(layout, gpus_per_node, c.rail_split);
  const std::size_t largest = largest_rail(parts);
  m.flat.hierarchy = Hierarchy::flat;
  m.layout = parts[largest].layout;
  m.n = parts[largest].size();
  m.workers = workers / gpus_per_node;
  m.rail = static_cast<int>(largest);
  return m;
}

namespace {

// The node is the topology's: G = its GPUs that take part.
MethodShare step_share(const StepInputs& in, int workers) {
  if (in.optimizer.hierarchy == Hierarchy::node && in.layout.size() == 0) {
    throw std::invalid_argument(
        "optimizer.hierarchy: \"node\" is predicted over the model's tensors; give the "
        "model (its layout decides each rail's part)");
  }
  return method_share(in.optimizer, in.layout, in.n_params, workers, place(in.topology, workers).gpus_per_node);
}

}  // namespace

StepPrediction predict_step(const StepInputs& given, int workers, double tokens_per_gpu) {
  // Under hierarchy node the node is the topology's: G = its GPUs that take part.
  StepInputs in = given;
  if (in.optimizer.hierarchy == Hierarchy::node)
    in.optimizer.ranks_per_node = place(in.topology, workers).gpus_per_node;
  StepPrediction s;
  s.workers = workers;
  s.tokens_per_gpu = tokens_per_gpu;
  if (in.fixed_compute_s > 0) {
    s.forward_s = in.fixed_compute_s / 3.0;
  } else if (in.compute_s_per_token > 0) {
    s.forward_s = in.compute_s_per_token * tokens_per_gpu / 3.0;
  } else {
    s.forward_s = in.flops_per_token * tokens_per_gpu / (3.0 * in.gpu.achieved_flops());
  }
  s.backward_s = 2.0 * s.forward_s;

  const OptimizerConfig& c = in.optimizer;
  const int t = steady_state_step(c);
  const bool tensors = in.layout.size() > 0;
  if (tensors && in.layout.size() != in.n_params) {
    throw std::invalid_argument("predict_step: the layout has " + std::to_string(in.layout.size()) +
                                " elements, n_params is " + std::to_string(in.n_params));
  }
  const MethodShare share = step_share(in, workers);
  if (has_outer_loop(c.type)) {
    s.optimizer_bytes = static_cast<double>(share.n) * dense_step_bytes(c);  // the inner step, unsharded
    s.state_s = s.optimizer_bytes / in.gpu.memory_Bps();
    add_outer_loop(s, in, workers, share.n);
    for (const auto& col : s.collectives) {
      s.comm_s += col.time_s;
      s.exposed_comm_s += col.exposed_s;
    }
    s.optimizer_s = s.state_s;
    s.step_s = s.compute_s() + s.optimizer_s + s.exposed_comm_s;
    return s;
  }
  // SCAPE's K over the model's tensors, or one tensor of N without them.
  const double rho = density_at(c.density_schedule(), t);
  const OptimizerConfig& flat = share.flat;
  const std::size_t k =
      tensors ? mask_k(flat, share.layout, share.workers, rho) : mask_k(flat, share.n, share.workers, rho);
  const auto m = union_size(flat, share.n, share.workers, in.fill_in, k);
  const auto records = c.hierarchy == Hierarchy::node
                           ? rail_step_collectives(c, in.layout, workers, share.rail, t, t + 1, in.topology.inter, m)
                       : tensors ? step_collectives(c, in.layout, workers, t, t + 1, in.topology.inter, m)
                                 : step_collectives(c, in.n_params, workers, t, t + 1, in.topology.inter, m);
  const auto loads = link_loads(records, in);
  for (std::size_t i = 0; i < records.size(); ++i) {
    s.collectives.push_back(cost(records[i], window_for(records[i], c, in.overlap), in, workers, loads[i]));
  }
  apply_overlap(s);
  for (const auto& col : s.collectives) {
    s.comm_s += col.time_s;
    s.exposed_comm_s += col.exposed_s;
  }
  const OptimizerBytes bytes = optimizer_bytes_by_kernel(flat, share.n, share.workers, m.value_or(k));
  s.optimizer_bytes = bytes.total();
  s.state_s = bytes.state / in.gpu.memory_Bps();
  s.select_s = bytes.select / in.gpu.select_Bps();
  s.pack_s = bytes.pack / in.gpu.pack_Bps();
  add_offload(s, in);
  s.optimizer_s = s.state_s + s.select_s + s.pack_s + s.offload_exposed_s;
  s.mask_codec_s = codec_seconds(flat, share.n, share.workers, in.gpu, k);
  s.step_s = s.compute_s() + s.optimizer_s + s.mask_codec_s + s.exposed_comm_s;
  return s;
}

}  // namespace scape::predict
