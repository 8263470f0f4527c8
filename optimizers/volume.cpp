// Per-step collectives of an optimizer configuration, mirroring the calls of the optimizers under
// optimizers/scape/ and optimizers/baselines/ one for one (same purposes, same order, same
// payload rule) and recording them through a ByteLedger.
#include "optimizers/volume.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/schedule.hpp"
#include "kernels/kernel_types.hpp"
#include "optimizers/baselines/outer_loop.hpp"
#include "optimizers/baselines/powersgd.hpp"
#include "optimizers/baselines/sparseloco_codec.hpp"
#include "optimizers/rail_partition.hpp"
#include "optimizers/scape/mask_codec.hpp"
#include "optimizers/scape/mask_ownership.hpp"

namespace scape {
namespace {

constexpr std::uint64_t kIndexBytes = sizeof(std::uint32_t);  // indices on the wire are 32-bit

bool partitioned(const OptimizerConfig& c) { return c.scape.mask_partition == MaskPartition::partitioned; }

// What the closed forms assume when they know N alone: one tensor of N elements.
ParamLayout single_tensor(std::size_t n) {
  ParamLayout layout(ParamLayout::kUnbounded);
  layout.add("params", {n}, true);
  return layout;
}

// One shard's coded message in words (optimizers/scape/mask_codec.hpp) when `kept` of its k_prev previous
// positions stay and k - kept are new.
std::size_t shard_message_words(MaskEncoding e, std::size_t n, std::size_t k, std::size_t k_prev, std::size_t kept) {
  if (mask_sizes_known(e)) return fixed_message_words(e, n, k);
  const std::size_t k_new = k - kept;
  const ShardFormat f = e == MaskEncoding::delta ? ShardFormat::delta : smallest_format(n, k, k_prev, k_new);
  return tagged_message_words(f, n, k, k_prev, k_new);
}

// The mask all-gather of SCAPE. Partitioned: every owner's message at the encoding (bitmap: the
// words that cover its range, which sum to the words of N when the ranges are shards, whose
// boundaries are multiples of 64), preceded by an all-gather of one size word per worker for
// delta and auto; the previous mask had density rho_prev (0: none yet) and keeps the fraction
// `kept_fraction` of its positions. local_union: every worker's K(rho) local indices, 4 bytes
// each (bitmap) or Elias-Fano coded among N (any other encoding).
void record_mask_gather(ByteLedger& ledger, const OptimizerConfig& c, const MaskOwnership& owners, double rho,
                        double rho_prev, double kept_fraction, bool overlapped) {
  const std::size_t n = owners.n();
  const int workers = owners.workers();
  if (partitioned(c)) {
    std::uint64_t words = 0;
    for (int w = 0; w < workers; ++w) {
      const std::size_t bits = owners.segment_bits(w);
      const std::size_t k = owners.k(w, rho);
      const std::size_t k_prev = rho_prev > 0 ? owners.k(w, rho_prev) : 0;
      const auto kept = std::min(k, static_cast<std::size_t>(kept_fraction * static_cast<double>(k_prev)));
      words += shard_message_words(c.mask_encoding, bits, k, k_prev, kept);
    }
    if (!mask_sizes_known(c.mask_encoding)) {
      ledger.record(CollectiveKind::all_gather, "mask_size_all_gather",
                    static_cast<std::uint64_t>(workers) * sizeof(std::uint64_t), false);
    }
    ledger.record(CollectiveKind::all_gather, "mask_all_gather", words * sizeof(std::uint64_t), overlapped);
    return;
  }
  const std::uint64_t k = k_for(rho, n);
  const std::uint64_t list_bytes = c.mask_encoding == MaskEncoding::bitmap
                                       ? k * kIndexBytes
                                       : kernels::ef_words(n, k) * sizeof(std::uint64_t);
  ledger.record(CollectiveKind::all_gather, "index_all_gather", static_cast<std::uint64_t>(workers) * list_bytes,
                overlapped);
}

// clip_grad with sharded state: each owner's sum of squares, one double a worker.
void record_clip_norm(ByteLedger& ledger, const OptimizerConfig& c, int workers) {
  if (c.clip_grad > 0 && c.sharded && workers > 1) {
    ledger.record(CollectiveKind::all_gather, "clip_norm_all_gather",
                  static_cast<std::uint64_t>(workers) * sizeof(double), false);
  }
}

void record_dense(ByteLedger& ledger, const OptimizerConfig& c, std::size_t n, int workers) {
  if (c.sharded) {
    ledger.record(CollectiveKind::reduce_scatter, "grad_reduce_scatter", n * wire_bytes(c.wire_dtype), false);
    record_clip_norm(ledger, c, workers);
    ledger.record(CollectiveKind::all_gather, "param_all_gather", n * wire_bytes(c.param_dtype), false);
  } else {
    ledger.record(CollectiveKind::all_reduce, "grad_all_reduce", n * wire_bytes(c.wire_dtype), false);
  }
}

// |M_t| of local_union: the caller's value, checked against [K, min(N, W K)].
std::size_t union_mask_size(std::size_t k, std::size_t n, int workers, std::optional<std::size_t> given) {
  if (!given) return k;
  const std::size_t upper = std::min(n, static_cast<std::size_t>(workers) * k);
  if (*given < k || *given > upper) {
    throw std::invalid_argument("step_collectives: union size " + std::to_string(*given) +
                                " is outside [K, min(N, W K)] = [" + std::to_string(k) + ", " +
                                std::to_string(upper) + "]");
  }
  return *given;
}

void record_scape(ByteLedger& ledger, const OptimizerConfig& c, const ParamLayout& layout, int workers, int t,
                  int total, std::optional<std::size_t> union_size, double kept_fraction) {
  const std::size_t n = layout.size();
  const MaskOwnership owners(layout, workers, c, c.scape);
  const auto rho_at = [&](int step) { return step < 1 ? 0.0 : density_at(c.density_schedule(), step); };
  const double rho = rho_at(t);
  // Step 2: the mask of step t is gathered now (lag 0, and step 1 under lag 1), coded against
  // the previous step's mask.
  if (c.scape.mask_lag == 0 || t == 1) record_mask_gather(ledger, c, owners, rho, rho_at(t - 1), kept_fraction, false);
  const std::size_t k = partitioned(c) ? owners.k_total(rho) : k_for(rho, n);
  const std::size_t m = partitioned(c) ? k : union_mask_size(k, n, workers, union_size);
  const std::uint64_t values = m * wire_bytes(c.wire_dtype);
  const bool two = c.scape.second_moment == SecondMoment::two_collectives;
  // The fp8 payload's shared scale: one float a worker.
  if (c.wire_dtype == WireType::fp8_e5m2) {
    ledger.record(CollectiveKind::all_gather, "fp8_scale_all_gather",
                  static_cast<std::uint64_t>(workers) * sizeof(float), false);
  }
  if (c.sharded) {
    ledger.record(CollectiveKind::reduce_scatter, "grad_reduce_scatter", values, false);
    if (two) ledger.record(CollectiveKind::reduce_scatter, "accum_reduce_scatter", values, false);
    record_clip_norm(ledger, c, workers);
    const std::size_t synced = c.scape.update == UpdateMode::dense ? n : m;
    ledger.record(CollectiveKind::all_gather, "param_all_gather", synced * wire_bytes(c.param_dtype), false);
  } else {
    ledger.record(CollectiveKind::all_reduce, "grad_all_reduce", values, false);
    if (two) ledger.record(CollectiveKind::all_reduce, "accum_all_reduce", values, false);
  }
  // Step 9: the next mask, at the next step's density, starts asynchronously; the last step
  // starts none.
  if (c.scape.mask_lag == 1 && t < total) {
    record_mask_gather(ledger, c, owners, rho_at(t + 1), rho, kept_fraction, true);
  }
}

void record_topk(ByteLedger& ledger, const OptimizerConfig& c, std::size_t n, int workers, int t) {
  const std::uint64_t k = k_for(density_at(c.density_schedule(), t), n);
  // Per worker k (index, value) records, or the Elias-Fano code of the k indices then k values.
  const std::uint64_t message = c.mask_encoding == MaskEncoding::bitmap
                                    ? k * (kIndexBytes + wire_bytes(c.wire_dtype))
                                    : kernels::ef_words(n, k) * sizeof(std::uint64_t) + k * wire_bytes(c.wire_dtype);
  ledger.record(CollectiveKind::all_gather, "topk_all_gather", static_cast<std::uint64_t>(workers) * message, false);
}

// The shared mask needs no index: one all-reduce of the K values.
void record_randk(ByteLedger& ledger, const OptimizerConfig& c, std::size_t n, int t) {
  const std::uint64_t k = k_for(density_at(c.density_schedule(), t), n);
  ledger.record(CollectiveKind::all_reduce, "grad_all_reduce", k * wire_bytes(c.wire_dtype), false);
}

// Warm-up: the dense all-reduce. Then one segment per shard, sign words and scales, is
// exchanged all-to-all and gathered again (onebit_payload_bytes).
void record_onebit(ByteLedger& ledger, const OptimizerConfig& c, std::size_t n, int workers, int t) {
  if (t <= c.onebit.freeze_step) {
    ledger.record(CollectiveKind::all_reduce, "grad_all_reduce", n * wire_bytes(c.wire_dtype), false);
    return;
  }
  const std::uint64_t payload = onebit_payload_bytes(n, workers, c.onebit.sign_chunk);
  ledger.record(CollectiveKind::all_to_all, "momentum_all_to_all", payload, false);
  ledger.record(CollectiveKind::all_gather, "momentum_all_gather", payload, false);
}

// The factors P of every matrix, then their Q, then the vectors dense (each only when any).
void record_powersgd(ByteLedger& ledger, const OptimizerConfig& c, const ParamLayout& layout) {
  const PowersgdPlan plan = powersgd_plan(layout, c.powersgd.rank);
  const std::uint64_t value = wire_bytes(c.wire_dtype);
  if (!plan.matrices.empty()) {
    ledger.record(CollectiveKind::all_reduce, "lowrank_p_all_reduce", plan.p_size * value, false);
    ledger.record(CollectiveKind::all_reduce, "lowrank_q_all_reduce", plan.q_size * value, false);
  }
  if (!plan.vectors.empty())
    ledger.record(CollectiveKind::all_reduce, "grad_all_reduce", plan.vector_size * value, false);
}

// DiLoCo and SparseLoCo: nothing between outer steps; at one, DiLoCo all-reduces its fragment's
// N_f pseudo-gradient values at outer_wire (after an all-gather of one float a worker for fp8),
// SparseLoCo all-gathers every worker's message. With overlap_outer the outer step's collectives
// hide behind the next step, but for the last step's.
void record_outer_loop(ByteLedger& ledger, const OptimizerConfig& c, const ParamLayout& layout, int workers, int t,
                       int total) {
  const int fragments = c.type == OptimizerType::diloco ? c.diloco.streaming_fragments : 1;
  const int f = fragment_synced_at(t, c.outer.inner_steps, fragments);
  if (f < 0) return;
  const bool overlapped = c.outer.overlap_outer && t < total;
  if (c.type == OptimizerType::sparseloco) {
    const std::uint64_t message = sparseloco_plan(layout, c, c.sparseloco).message_bytes();
    ledger.record(CollectiveKind::all_gather, "sparseloco_all_gather", static_cast<std::uint64_t>(workers) * message,
                  overlapped);
    return;
  }
  const auto bounds = fragment_boundaries(layout, fragments);
  const std::size_t values = bounds[static_cast<std::size_t>(f) + 1] - bounds[static_cast<std::size_t>(f)];
  if (c.diloco.outer_wire == WireType::fp8_e5m2) {
    ledger.record(CollectiveKind::all_gather, "outer_scale_all_gather",
                  static_cast<std::uint64_t>(workers) * sizeof(float), overlapped);
  }
  ledger.record(CollectiveKind::all_reduce, "outer_all_reduce", values * wire_bytes(c.diloco.outer_wire), overlapped);
}

}  // namespace

std::uint64_t demo_message_bytes(std::size_t n_params, std::size_t chunk, std::size_t k, WireType wire) {
  const std::size_t entries = kernels::chunk_topk_count(n_params, chunk, k);
  return kernels::ef_words(n_params, entries) * sizeof(std::uint64_t) + entries * wire_bytes(wire);
}

std::uint64_t onebit_payload_bytes(std::size_t n_params, int workers, std::size_t chunk) {
  const Sharding sharding(n_params, workers);
  std::uint64_t bytes = 0;
  for (int w = 0; w < workers; ++w) {
    const std::size_t size = sharding.size(w);
    bytes += kernels::words_for(size) * sizeof(std::uint64_t) + (size + chunk - 1) / chunk * sizeof(float);
  }
  return bytes;
}

std::size_t mask_k(const OptimizerConfig& config, std::size_t n_params, int workers, double rho) {
  if (n_params == 0) return 0;
  return mask_k(config, single_tensor(n_params), workers, rho);
}

std::size_t mask_k(const OptimizerConfig& config, const ParamLayout& layout, int workers, double rho) {
  const std::size_t n_params = layout.size();
  switch (config.type) {
    case OptimizerType::adamw:
    case OptimizerType::adams:
    case OptimizerType::onebit_adam:
    case OptimizerType::powersgd:
    case OptimizerType::demo:
    case OptimizerType::diloco:
    case OptimizerType::sparseloco:
      return 0;
    case OptimizerType::topk_ef:
    case OptimizerType::randk_ef:
      return k_for(rho, n_params);
    case OptimizerType::scape:
      break;
  }
  if (!partitioned(config)) return k_for(rho, n_params);
  return MaskOwnership(layout, workers, config, config.scape).k_total(rho);
}

namespace {

// Both overloads: the layout decides SCAPE's owners and k (the N-only one passes one tensor).
std::vector<CommRecord> collectives(const OptimizerConfig& config, const ParamLayout& layout, int workers, int step,
                                    int total_steps, const NetworkModel& net, std::optional<std::size_t> union_size,
                                    double mask_kept_fraction) {
  config.validate();
  if (config.hierarchy == Hierarchy::node) {
    return rail_step_collectives(config, layout, workers, 0, step, total_steps, net, union_size, mask_kept_fraction);
  }
  const std::size_t n_params = layout.size();
  if (!(mask_kept_fraction >= 0 && mask_kept_fraction <= 1)) {
    throw std::invalid_argument("step_collectives: mask kept fraction " + std::to_string(mask_kept_fraction) +
                                " is outside [0, 1]");
  }
  if (n_params == 0) throw std::invalid_argument("step_collectives: n_params must be > 0");
  if (total_steps < 1 || step < 1 || step > total_steps) {
    throw std::invalid_argument("step_collectives: step " + std::to_string(step) + " is outside [1, " +
                                std::to_string(total_steps) + "]");
  }
  ByteLedger ledger(workers, net);
  switch (config.type) {
    case OptimizerType::adamw:
    case OptimizerType::adams:
      record_dense(ledger, config, n_params, workers);
      break;
    case OptimizerType::scape:
      record_scape(ledger, config, layout, workers, step, total_steps, union_size, mask_kept_fraction);
      break;
    case OptimizerType::topk_ef:
      record_topk(ledger, config, n_params, workers, step);
      break;
    case OptimizerType::randk_ef:
      record_randk(ledger, config, n_params, step);
      break;
    case OptimizerType::onebit_adam:
      record_onebit(ledger, config, n_params, workers, step);
      break;
    case OptimizerType::powersgd:
      record_powersgd(ledger, config, layout);
      break;
    case OptimizerType::demo:
      ledger.record(CollectiveKind::all_gather, "demo_all_gather",
                    static_cast<std::uint64_t>(workers) *
                        demo_message_bytes(n_params, config.demo.chunk, config.demo.topk, config.wire_dtype),
                    false);
      break;
    case OptimizerType::diloco:
    case OptimizerType::sparseloco:
      record_outer_loop(ledger, config, layout, workers, step, total_steps);
      break;
  }
  return ledger.drain();
}

}  // namespace

std::vector<CommRecord> rail_step_collectives(const OptimizerConfig& config, const ParamLayout& layout, int workers,
                                              int rail, int step, int total_steps, const NetworkModel& net,
                                              std::optional<std::size_t> union_size, double mask_kept_fraction) {
  const int g = config.ranks_per_node;
  if (config.hierarchy != Hierarchy::node) {
    throw std::invalid_argument("rail_step_collectives: optimizer.hierarchy is \"flat\"; use step_collectives");
  }
  if (g < 1 || workers % g != 0) {
    throw std::invalid_argument("topology.ranks_per_node: " + std::to_string(g) +
                                " does not divide workers = " + std::to_string(workers));
  }
  if (rail < 0 || rail >= g) {
    throw std::invalid_argument("rail_step_collectives: rail " + std::to_string(rail) + " is outside [0, " +
                                std::to_string(g) + ")");
  }
  const auto parts = split_into_rails(layout, g, config.rail_split);
  OptimizerConfig flat = config;
  flat.hierarchy = Hierarchy::flat;
  flat.rail_split = RailSplit::tensors;
  const std::uint64_t n_bytes = layout.size() * sizeof(float);
  ByteLedger node(g, config.node_link.value_or(net), LinkClass::intra);
  node.record(CollectiveKind::reduce_scatter, "node_grad_reduce_scatter", n_bytes, false);
  std::vector<CommRecord> out = node.drain();
  for (auto& r : collectives(flat, parts[static_cast<std::size_t>(rail)].layout, workers / g, step, total_steps, net,
                             union_size, mask_kept_fraction)) {
    out.push_back(std::move(r));
  }
  node.record(CollectiveKind::all_gather, "node_param_all_gather", n_bytes, false);
  out.push_back(std::move(node.drain().front()));
  return out;
}

std::vector<CommRecord> step_collectives(const OptimizerConfig& config, std::size_t n_params, int workers, int step,
                                         int total_steps, const NetworkModel& net,
                                         std::optional<std::size_t> union_size, double mask_kept_fraction) {
  if (config.type == OptimizerType::powersgd) {
    throw std::invalid_argument(
        "step_collectives: powersgd's bytes depend on the tensor shapes; pass the parameter layout");
  }
  if (n_params == 0) throw std::invalid_argument("step_collectives: n_params must be > 0");
  return collectives(config, single_tensor(n_params), workers, step, total_steps, net, union_size, mask_kept_fraction);
}

std::vector<CommRecord> step_collectives(const OptimizerConfig& config, const ParamLayout& layout, int workers,
                                         int step, int total_steps, const NetworkModel& net,
                                         std::optional<std::size_t> union_size, double mask_kept_fraction) {
  if (layout.size() == 0) throw std::invalid_argument("step_collectives: the parameter layout is empty");
  return collectives(config, layout, workers, step, total_steps, net, union_size, mask_kept_fraction);
}

}  // namespace scape
