// The key tables of experiment configs, one row per key. A row names no default: the default is
// the member's value in the default-built struct.
#include "experiments/config_keys.hpp"

#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace scape::experiments {
namespace {

using nlohmann::json;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The value a resolved config records for a member.
template <typename T>
  requires std::is_arithmetic_v<T>
json recorded(T v) {
  return v;
}
json recorded(const std::string& v) { return v; }
json recorded(const std::filesystem::path& v) { return v.string(); }
json recorded(OptimizerType v) { return to_string(v); }
json recorded(InnerRule v) { return to_string(v); }
json recorded(UpdateMode v) { return to_string(v); }
json recorded(MaskStatistic v) { return to_string(v); }
json recorded(MaskPartition v) { return to_string(v); }
json recorded(SecondMoment v) { return to_string(v); }
json recorded(MaskEncoding v) { return to_string(v); }
json recorded(Formulation v) { return to_string(v); }
json recorded(MaskScope v) { return to_string(v); }
json recorded(const std::vector<std::string>& v) { return v; }
json recorded(WireType v) { return to_string(v); }
json recorded(kernels::DeviceKind v) { return kernels::to_string(v); }

// A member set from a value the Section has checked (type, range, choices), so the parsers
// below cannot fail; only an integer too large for the member's type remains.
template <std::integral T>
void assign(T& out, const json& v) {
  const bool fits = v.is_number_unsigned() ? std::in_range<T>(v.get<std::uint64_t>())
                                           : std::in_range<T>(v.get<std::int64_t>());
  if (!fits) {
    throw std::out_of_range(v.dump() + " is out of range [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                            std::to_string(std::numeric_limits<T>::max()) + "]");
  }
  out = v.get<T>();
}
void assign(bool& out, const json& v) { out = v.get<bool>(); }
void assign(double& out, const json& v) { out = v.get<double>(); }
void assign(std::string& out, const json& v) { out = v.get<std::string>(); }
void assign(std::filesystem::path& out, const json& v) { out = v.get<std::string>(); }
void assign(OptimizerType& out, const json& v) { out = parse_optimizer_type(v.get<std::string>()); }
void assign(InnerRule& out, const json& v) { out = parse_inner_rule(v.get<std::string>()); }
void assign(UpdateMode& out, const json& v) { out = parse_update_mode(v.get<std::string>()); }
void assign(MaskStatistic& out, const json& v) { out = parse_mask_statistic(v.get<std::string>()); }
void assign(MaskPartition& out, const json& v) { out = parse_mask_partition(v.get<std::string>()); }
void assign(SecondMoment& out, const json& v) { out = parse_second_moment(v.get<std::string>()); }
void assign(MaskEncoding& out, const json& v) { out = parse_mask_encoding(v.get<std::string>()); }
void assign(Formulation& out, const json& v) { out = parse_formulation(v.get<std::string>()); }
void assign(MaskScope& out, const json& v) { out = parse_mask_scope(v.get<std::string>()); }
void assign(std::vector<std::string>& out, const json& v) { out = v.get<std::vector<std::string>>(); }
void assign(WireType& out, const json& v) { out = parse_wire_type(v.get<std::string>(), "wire type"); }
void assign(kernels::DeviceKind& out, const json& v) {
  out = kernels::parse_device_kind(v.get<std::string>(), "optimizer.device");
}

// The read and write accessors of one member of Config: the two function pointers of a Key.
#define SCAPE_MEMBER(Config, member) \
  [](const Config& c) -> json { return recorded(c.member); }, [](Config& c, const json& v) { assign(c.member, v); }

const std::vector<std::string> kSparse = {"scape", "topk_ef", "randk_ef"};
const std::vector<std::string> kScape = {"scape"};
const std::vector<std::string> kDense = {"adamw", "adams"};
const std::vector<std::string> kOnebit = {"onebit_adam"};
const std::vector<std::string> kInnerRule = {"scape", "topk_ef", "randk_ef", "powersgd"};
const std::vector<std::string> kPowersgd = {"powersgd"};
const std::vector<std::string> kDemo = {"demo"};
const std::vector<std::string> kWireTypes = wire_type_names();
// The optimizers whose update rule can be AdamS, and those that form a synchronized gradient to clip.
const std::vector<std::string> kAdamsRule = {"adams", "scape", "topk_ef", "randk_ef", "powersgd"};
const std::vector<std::string> kClipped = {"adamw", "adams", "scape", "topk_ef", "randk_ef", "powersgd"};

std::vector<std::string> gpu_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : predict::gpu_presets()) names.emplace_back(p.name);
  return names;
}

json record_min_lr(const OptimizerConfig& c) { return c.resolved_min_lr(); }
void assign_min_lr(OptimizerConfig& c, const json& v) { c.min_lr = v.get<double>(); }
json record_adams_form(const OptimizerConfig& c) { return to_string(c.resolved_adams_form()); }
void assign_adams_form(OptimizerConfig& c, const json& v) { c.adams_form = parse_adams_form(v.get<std::string>()); }
json record_betas(const OptimizerConfig& c) { return {c.beta1, c.beta2}; }
void assign_betas(OptimizerConfig& c, const json& v) {
  c.beta1 = v[0].get<double>();
  c.beta2 = v[1].get<double>();
}

}  // namespace

const KeyTable<ExperimentConfig>& top_keys() {
  using C = ExperimentConfig;
  static const KeyTable<C> t({
      {{"name", Kind::string, "run name (used in file names and tables)"}, SCAPE_MEMBER(C, name)},
      {{"description", Kind::string, "free text: what the run tests; stored with the run"},
       SCAPE_MEMBER(C, description)},
      {{"seed", Kind::integer, "seed of every random choice (init, data, noise, random masks)", {0, 9.007e15}},
       SCAPE_MEMBER(C, seed)},
      {{"workers", Kind::integer, "number of data-parallel workers W", {1, 1024}}, SCAPE_MEMBER(C, workers)},
      {{"steps", Kind::integer, "optimizer steps T", {1, 1e9}}, SCAPE_MEMBER(C, steps)},
      {{"device", Kind::string,
        "where the model, its parameters and gradients live and run; the optimizer follows unless optimizer.device "
        "is given (cuda: gpt and llama only, needs a CUDA build and a GPU)",
        {}, kernels::device_kind_names()},
       SCAPE_MEMBER(C, device)},
      {{"model", Kind::object, "model section"}},
      {{"data", Kind::object, "data section (gpt and llama models only)"}},
      {{"optimizer", Kind::object, "optimizer section"}},
      {{"network", Kind::object, "network model for modelled communication time"}},
      {{"compute", Kind::object, "what the modelled step time takes as compute: measured or from FLOPs"}},
      {{"eval", Kind::object, "validation section (gpt, llama and external models)"}},
      {{"log", Kind::object, "logging section"}},
  });
  return t;
}

const KeyTable<ModelSection>& model_keys() {
  using C = ModelSection;
  static const KeyTable<C> t({
      {{"type", Kind::string,
        "gpt, llama (RMSNorm, RoPE, SwiGLU, untied head), replay (gradients from a trace file), quadratic "
        "(noisy quadratic) or external (gradients handed in by the caller: the Python package's scape.Simulator; "
        "scape run cannot produce them)",
        {}, {"gpt", "llama", "replay", "quadratic", "external"}},
       SCAPE_MEMBER(C, type)},
      {{"n_layer", Kind::integer, "transformer blocks", {1, 64}, {}, {"gpt", "llama"}}, SCAPE_MEMBER(C, n_layer)},
      {{"n_head", Kind::integer, "attention heads (must divide n_embd)", {1, 64}, {}, {"gpt", "llama"}},
       SCAPE_MEMBER(C, n_head)},
      {{"n_embd", Kind::integer, "embedding width (llama: n_embd / n_head must be even)", {1, 4096}, {},
        {"gpt", "llama"}},
       SCAPE_MEMBER(C, n_embd)},
      {{"block_size", Kind::integer, "sequence length T", {1, 4096}, {}, {"gpt", "llama"}},
       SCAPE_MEMBER(C, block_size)},
      {{"vocab_size", Kind::integer, "vocabulary (256 for bytes, 50257 for GPT-2 tokens)", {2, 1 << 20}, {},
        {"gpt", "llama"}},
       SCAPE_MEMBER(C, vocab_size)},
      {{"n_kv_head", Kind::integer, "key/value heads of grouped-query attention (must divide n_head; 0: n_head)",
        {0, 64}, {}, {"llama"}},
       SCAPE_MEMBER(C, n_kv_head)},
      {{"precision", Kind::string,
        "GEMMs of the linear layers: fp32, or bf16 (operands rounded to bf16, fp32 sums; master weights, "
        "activations, norms, attention and loss stay fp32)",
        {}, {"fp32", "bf16"}, {"gpt", "llama"}},
       SCAPE_MEMBER(C, precision)},
      {{"ffn_hidden", Kind::integer, "SwiGLU hidden size (0: 8/3 n_embd rounded up to a multiple of 64)",
        {0, 65536}, {}, {"llama"}},
       SCAPE_MEMBER(C, ffn_hidden)},
      {{"path", Kind::string, "trace file (HDF5), relative to the config file", {}, {}, {"replay"}},
       SCAPE_MEMBER(C, path), Default::required},
      {{"size", Kind::integer, "number of parameters", {64, 4e9}, {}, {"quadratic"}}, SCAPE_MEMBER(C, size)},
      {{"noise", Kind::number, "gradient noise sigma", {0, kInf}, {}, {"quadratic"}},
       SCAPE_MEMBER(C, noise)},
      {{"curvature_tail", Kind::number, "Pareto shape of the curvature (smaller = heavier tail)",
        {0, kInf, true}, {}, {"quadratic"}},
       SCAPE_MEMBER(C, curvature_tail)},
  });
  return t;
}

const KeyTable<DataSection>& data_keys() {
  using C = DataSection;
  static const KeyTable<C> t({
      {{"type", Kind::string, "synthetic (built-in Markov corpus), text (bytes of a file) or tokens (.bin shards)",
        {}, {"synthetic", "text", "tokens"}},
       SCAPE_MEMBER(C, type)},
      {{"path", Kind::string, "the file, relative to the config file", {}, {}, {"text", "tokens"}},
       SCAPE_MEMBER(C, path), Default::required},
      {{"format", Kind::string, "nanogpt (raw uint16), llmc (256-int32 header) or auto (by header magic)",
        {}, {"auto", "nanogpt", "llmc"}, {"tokens"}},
       SCAPE_MEMBER(C, format)},
      {{"batch_size", Kind::integer, "sequences per worker per step", {1, 1 << 20}}, SCAPE_MEMBER(C, batch_size)},
      {{"val_fraction", Kind::number, "fraction of the tokens held out for validation", {0, 0.9, true}},
       SCAPE_MEMBER(C, val_fraction)},
      {{"tokens", Kind::integer, "corpus length in tokens", {1000, 1e10}, {}, {"synthetic"}},
       SCAPE_MEMBER(C, tokens)},
      {{"successors", Kind::integer, "favoured successors per state", {1, 1 << 20}, {}, {"synthetic"}},
       SCAPE_MEMBER(C, successors)},
      {{"concentration", Kind::number, "probability mass on the favoured successors", {0, 1, false, true},
        {}, {"synthetic"}},
       SCAPE_MEMBER(C, concentration)},
  });
  return t;
}

// The range core declares for an optimizer key (OptimizerConfig::validate() enforces the same).
Range core_range(const char* key) {
  const OptimizerKeyRange& r = optimizer_key_range(key);
  return {r.minimum, r.maximum, r.exclusive_minimum, r.exclusive_maximum};
}

// Ranges come from core (core_range); min_lr's bound by lr and the betas stay in validate().
const KeyTable<OptimizerConfig>& optimizer_keys() {
  using C = OptimizerConfig;
  static const KeyTable<C> t({
      {{"type", Kind::string, "adamw, adams (dense), scape, topk_ef (raw-gradient top-k with error feedback), randk_ef (shared-seed random-k with error feedback), onebit_adam (1-bit Adam), powersgd (rank-r PowerSGD with error feedback), demo (DeMo: DCT top-k of local momentum, sign steps)", {},
        optimizer_switch_names("type")},
       SCAPE_MEMBER(C, type)},
      {{"lr", Kind::number, "peak learning rate", core_range("lr")}, SCAPE_MEMBER(C, lr)},
      // The range of the JSON value: a negative min_lr in the struct means "lr / 10".
      {{"min_lr", Kind::number, "final learning rate of the cosine schedule (default lr/10)", {0, kInf}},
       record_min_lr, assign_min_lr, Default::derived},
      {{"warmup_steps", Kind::integer, "linear warm-up steps", core_range("warmup_steps")}, SCAPE_MEMBER(C, warmup_steps)},
      {{"betas", Kind::number_pair, "[beta1, beta2]"}, record_betas, assign_betas},
      {{"eps", Kind::number, "epsilon of the denominator", core_range("eps")}, SCAPE_MEMBER(C, eps)},
      {{"weight_decay", Kind::number, "decoupled weight decay on flagged tensors",
        core_range("weight_decay")}, SCAPE_MEMBER(C, weight_decay)},
      {{"bias_correction", Kind::boolean, "Adam bias correction"}, SCAPE_MEMBER(C, bias_correction)},
      {{"sparsity", Kind::number, "fraction of coordinates not sent (density = 1 - sparsity)",
        core_range("sparsity"), {}, kSparse},
       SCAPE_MEMBER(C, sparsity)},
      {{"sharded", Kind::boolean, "distributed optimizer state (default true; false for topk_ef, randk_ef, onebit_adam, powersgd and demo)"},
       SCAPE_MEMBER(C, sharded), Default::derived},
      {{"overlap_grad_reduce", Kind::boolean,
        "reduce-scatter the gradient in buckets during the backward pass, one per model block (default false; "
        "recorded only when true)", {}, {}, kDense},
       [](const C& c) -> json { return c.overlap_grad_reduce ? json(true) : json(json::value_t::discarded); },
       [](C& c, const json& v) { assign(c.overlap_grad_reduce, v); }},
      {{"wire_dtype", Kind::string, "precision of gradient payloads", {}, kWireTypes}, SCAPE_MEMBER(C, wire_dtype)},
      {{"param_dtype", Kind::string, "precision of parameter payloads", {}, kWireTypes}, SCAPE_MEMBER(C, param_dtype)},
      {{"inner", Kind::string, "update rule of the sparse optimizers and powersgd", {}, optimizer_switch_names("inner"),
        kInnerRule},
       SCAPE_MEMBER(C, inner)},
      {{"update", Kind::string, "masked or dense update", {}, optimizer_switch_names("update"), kScape}, SCAPE_MEMBER(C, update)},
      {{"mask_statistic", Kind::string, "what top-k ranks", {}, optimizer_switch_names("mask_statistic"),
        kScape},
       SCAPE_MEMBER(C, mask_statistic)},
      {{"mask_partition", Kind::string, "per-owner shards or union of local masks", {}, optimizer_switch_names("mask_partition"),
        kScape},
       SCAPE_MEMBER(C, mask_partition)},
      {{"mask_lag", Kind::integer, "1 = mask computed one step ahead, 0 = blocking",
        core_range("mask_lag"), {}, kScape},
       SCAPE_MEMBER(C, mask_lag)},
      {{"second_moment", Kind::string, "one synchronized buffer or two collectives", {},
        optimizer_switch_names("second_moment"), kScape},
       SCAPE_MEMBER(C, second_moment)},
      {{"mask_encoding", Kind::string, "how masks and index lists are coded on the wire", {},
        optimizer_switch_names("mask_encoding"), kSparse},
       SCAPE_MEMBER(C, mask_encoding)},
      {{"residual", Kind::boolean, "error feedback (keep undelivered gradient)", {}, {}, kSparse},
       SCAPE_MEMBER(C, residual)},
      {{"residual_decay", Kind::number, "factor gamma the residual keeps off the mask each step (1 = all, 0 = none)",
        core_range("residual_decay"), {}, kSparse},
       SCAPE_MEMBER(C, residual_decay)},
      {{"residual_clip", Kind::number, "cap each tensor's residual norm at this multiple of its gradient norm (0 = off)",
        core_range("residual_clip"), {}, kSparse},
       SCAPE_MEMBER(C, residual_clip)},
      {{"density_warmup", Kind::integer, "steps of exponential density decay from 1 (0 = off)",
        core_range("density_warmup"), {}, kSparse},
       SCAPE_MEMBER(C, density_warmup)},
      {{"density_start", Kind::number, "density s at step 1 of the warm-up, decaying geometrically to 1 - sparsity",
        core_range("density_start"), {}, kSparse},
       SCAPE_MEMBER(C, density_start)},
      {{"density_cooldown", Kind::integer, "steps of geometric density rise back to 1 (0 = off)",
        core_range("density_cooldown"), {}, kSparse},
       SCAPE_MEMBER(C, density_cooldown)},
      {{"density_cooldown_start", Kind::integer, "0-based step at which the density cool-down starts",
        core_range("density_cooldown_start"), {}, kSparse},
       SCAPE_MEMBER(C, density_cooldown_start)},
      {{"formulation", Kind::string,
        "SCAPE's algorithm: paper (the authors' artifact, residual in momentum units, m zero off the mask), "
        "artifact (its code with its quirks), frozen_momentum (the earlier formulation)",
        {}, optimizer_switch_names("formulation"), kScape},
       SCAPE_MEMBER(C, formulation)},
      {{"mask_scope", Kind::string, "where k is counted: per tensor (or its fragment in a shard) or per whole shard",
        {}, optimizer_switch_names("mask_scope"), kScape},
       SCAPE_MEMBER(C, mask_scope)},
      {{"dense_tensors", Kind::string_list,
        "name substrings of the tensors always on the mask (default [\"norm\", \"bias\"] under mask_scope = tensor, "
        "[] under shard)",
        {}, {}, kScape},
       SCAPE_MEMBER(C, dense_tensors), Default::derived},
      {{"adams_form", Kind::string,
        "where AdamS's bias corrections sit: artifact (on v and m, the artifact's AdamS.py) or momentum_corrected "
        "(on m_prev inside the root); default momentum_corrected for formulation = frozen_momentum, else artifact",
        {}, optimizer_switch_names("adams_form"), kAdamsRule},
       record_adams_form, assign_adams_form, Default::derived},
      {{"clip_grad", Kind::number,
        "global-norm clipping of the synchronized gradient (SCAPE: the reconstructed one) at this norm (0 = off)",
        core_range("clip_grad"), {}, kClipped},
       SCAPE_MEMBER(C, clip_grad)},
      {{"device", Kind::string,
        "where the optimizer's kernels and state live (default: the top-level device; cuda needs a CUDA build and GPU)",
        {},
        kernels::device_kind_names(), kScape},
       SCAPE_MEMBER(C, device)},
      {{"residual_offload", Kind::boolean, "keep the residual in pinned host memory, streamed through two device chunks",
        {}, {}, kScape},
       SCAPE_MEMBER(C, residual_offload)},
      {{"offload_chunk", Kind::integer, "elements per device chunk of the offloaded residual",
        core_range("offload_chunk"), {}, kScape},
       SCAPE_MEMBER(C, offload_chunk)},
      {{"freeze_step", Kind::integer, "1-bit Adam: dense AdamW steps before the variance is frozen and momentum is sent as signs",
        core_range("freeze_step"), {}, kOnebit},
       SCAPE_MEMBER(C, freeze_step)},
      {{"sign_chunk", Kind::integer, "1-bit Adam: coordinates of a shard that share one scale of the sign compression",
        core_range("sign_chunk"), {}, kOnebit},
       SCAPE_MEMBER(C, sign_chunk)},
      {{"powersgd_rank", Kind::integer, "PowerSGD: rank of each matrix's factors (clipped to min(rows, cols))",
        core_range("powersgd_rank"), {}, kPowersgd},
       SCAPE_MEMBER(C, powersgd_rank)},
      {{"demo_chunk", Kind::integer, "DeMo: coordinates of the flat buffer per DCT chunk",
        core_range("demo_chunk"), {}, kDemo},
       SCAPE_MEMBER(C, demo_chunk)},
      {{"demo_topk", Kind::integer, "DeMo: DCT coefficients each chunk sends (at most demo_chunk)",
        core_range("demo_topk"), {}, kDemo},
       SCAPE_MEMBER(C, demo_topk)},
  });
  return t;
}

const KeyTable<NetworkSection>& network_keys() {
  using C = NetworkSection;
  static const KeyTable<C> t({
      {{"preset", Kind::string, "ib_ndr400, nvlink_h100, pcie_gen5, eth_100g or loopback (docs/network.md)"},
       SCAPE_MEMBER(C, preset)},
      {{"alpha_us", Kind::number, "latency per message step in microseconds (overrides the preset)", {0, kInf}},
       SCAPE_MEMBER(C, alpha_us), Default::derived},
      {{"bandwidth_GBps", Kind::number, "per-worker bandwidth in GB/s (overrides the preset)", {0, kInf, true}},
       SCAPE_MEMBER(C, bandwidth_GBps), Default::derived},
  });
  return t;
}

const KeyTable<ComputeSection>& compute_keys() {
  using C = ComputeSection;
  static const KeyTable<C> t({
      {{"type", Kind::string,
        "measured (thread CPU seconds of forward/backward) or flops (training FLOPs of the gpt shape on a GPU)", {},
        {"measured", "flops"}},
       SCAPE_MEMBER(C, type)},
      {{"device", Kind::string, "GPU preset of scape predict whose dense bf16 peak the FLOPs run at", {},
        gpu_preset_names(), {"flops"}},
       SCAPE_MEMBER(C, device)},
      {{"mfu", Kind::number, "achieved fraction of the device's peak", {0, 1, true}, {}, {"flops"}},
       SCAPE_MEMBER(C, mfu)},
  });
  return t;
}

const KeyTable<EvalSection>& eval_keys() {
  using C = EvalSection;
  static const KeyTable<C> t({
      {{"interval", Kind::integer, "steps between validation evaluations (the last step always evaluates)", {1, 1e9}},
       SCAPE_MEMBER(C, interval)},
      {{"batches", Kind::integer, "validation batches per evaluation", {1, 1e6}}, SCAPE_MEMBER(C, batches)},
  });
  return t;
}

const KeyTable<LogSection>& log_keys() {
  using C = LogSection;
  static const KeyTable<C> t({
      {{"flush_interval", Kind::integer, "steps between flushes of the run file", {1, 1e9}},
       SCAPE_MEMBER(C, flush_interval)},
      {{"save_params", Kind::boolean, "write the final parameters to /final/params"}, SCAPE_MEMBER(C, save_params)},
      {{"oracle", Kind::boolean,
        "compute mask_oracle_overlap and mask_energy_capture (a copy of a_i per worker per step); the default is "
        "false with --backend mpi or nccl, where a_i travels to rank 0"},
       SCAPE_MEMBER(C, oracle)},
      {{"gradient_metrics_interval", Kind::integer,
        "steps between the metrics that need every worker's whole gradient on rank 0 (grad_norm, the oracle "
        "metrics): taken at steps 1, 1 + k, ...; in a multi-process run each costs W N floats sent to rank 0, and "
        "the default there is 100",
        {1, 1e9}},
       SCAPE_MEMBER(C, gradient_metrics_interval)},
  });
  return t;
}

#undef SCAPE_MEMBER

}  // namespace scape::experiments
