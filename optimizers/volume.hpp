// Collectives of one optimizer step computed without running the optimizer: the payload of
// every collective the optimizers of core/ would issue at step t, recorded through a
// ByteLedger so that bytes, latency steps and modelled time come from the same closed forms
// (core/ledger.cpp) as a simulator or MPI run. The predictor (predict/) builds on this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/layout.hpp"
#include "core/ledger.hpp"
#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"

namespace scape {

// The global mask size K of SCAPE or top-k at density rho: the sum of the owners' k
// (partitioned; optimizers/scape/mask_ownership.hpp, for a model of one tensor of N elements) or k(rho, N)
// (local_union, topk_ef, randk_ef). Zero for dense optimizers.
std::size_t mask_k(const OptimizerConfig& config, std::size_t n_params, int workers, double rho);
// The same over the layout's tensors: under mask_scope = tensor a sum of per-tensor floors
// (per fragment of a shard when sharded), with the dense_tensors kept whole.
std::size_t mask_k(const OptimizerConfig& config, const ParamLayout& layout, int workers, double rho);

// 1-bit Adam's compressed payload: per shard S_w its sign words and one fp32 scale per chunk,
// sum over w of 8 ceil(|S_w| / 64) + 4 ceil(|S_w| / chunk) = 8 ceil(N / 64) + 4 sum ceil(...).
std::uint64_t onebit_payload_bytes(std::size_t n_params, int workers, std::size_t chunk);

// DeMo's message per worker: the Elias-Fano code of its K = chunk_topk_count(N, chunk, k)
// coefficient positions among N, then K values at the wire width.
std::uint64_t demo_message_bytes(std::size_t n_params, std::size_t chunk, std::size_t k, WireType wire);

// The records the ledger of any worker holds after step `step` (1-based) of `total_steps`,
// in the order the optimizer issues them. SCAPE with mask_partition = local_union reduces the
// union |M_t| of the local masks, which depends on the data: pass it as `union_size` (it lies
// in [K, min(N, W K)]; K when absent). The delta and auto mask encodings code a shard against
// the previous step's: `mask_kept_fraction` of its positions stay (2J / (1 + J) at a Jaccard J
// between steps whose densities are equal; 0, the default, is delta's largest size). Throws
// std::invalid_argument for an invalid config, workers < 1, n_params = 0, a step outside
// [1, total_steps], a union size or kept fraction outside its range, and for powersgd, whose
// bytes depend on the tensor shapes (use the overload with the layout).
std::vector<CommRecord> step_collectives(const OptimizerConfig& config, std::size_t n_params, int workers, int step,
                                         int total_steps, const NetworkModel& net,
                                         std::optional<std::size_t> union_size = std::nullopt,
                                         double mask_kept_fraction = 0.0);
// Under optimizer.hierarchy = "node" both give the records of rank 0 (rail 0; rail_step_collectives).
// The same from the parameter layout, which every optimizer type accepts: PowerSGD all-reduces
// sum r'(rows) and sum r'(cols) factor entries and the vectors' entries (core/
// powersgd_optimizer.hpp, PowersgdPlan); SCAPE's owners and per-tensor k follow the layout's
// tensors (the N-only overload takes the model as one tensor of N elements); the others depend
// on N alone.
std::vector<CommRecord> step_collectives(const OptimizerConfig& config, const ParamLayout& layout, int workers,
                                         int step, int total_steps, const NetworkModel& net,
                                         std::optional<std::size_t> union_size = std::nullopt,
                                         double mask_kept_fraction = 0.0);
// optimizer.hierarchy = "node": the records of a rank of rail `rail` (docs/algorithms.md,
// "Hierarchy"): the node's reduce-scatter of the N-value gradient among G = ranks_per_node ranks
// (intra), the flat method's records on the rail's part among W / G nodes (inter), the node's
// all-gather of the N parameters (intra); both node collectives at fp32, modelled with
// config.node_link when given, else with `net`. Throws
// std::invalid_argument for hierarchy flat, a rail outside [0, G) or a G that does not divide W.
std::vector<CommRecord> rail_step_collectives(const OptimizerConfig& config, const ParamLayout& layout, int workers,
                                              int rail, int step, int total_steps, const NetworkModel& net,
                                              std::optional<std::size_t> union_size = std::nullopt,
                                              double mask_kept_fraction = 0.0);

}  // namespace scape
