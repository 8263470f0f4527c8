// Strict experiment-config parsing, defaults, JSON Schema and sweep expansion. One table of
// fields per section drives the unknown-key check, the type and range checks, the defaults
// and the schema, so the four never disagree.
#include "experiments/config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "sim/network_presets.hpp"

namespace scape::experiments {
namespace {

using nlohmann::json;

enum class Kind { integer, number, boolean, string, betas, object };

struct Field {
  const char* key;
  Kind kind;
  const char* description;
  json default_value;                 // null: required or no default
  double minimum = -std::numeric_limits<double>::infinity();
  double maximum = std::numeric_limits<double>::infinity();
  bool exclusive_minimum = false;
  bool exclusive_maximum = false;
  std::vector<std::string> choices = {};
};

constexpr double kInf = std::numeric_limits<double>::infinity();

const std::vector<Field>& top_fields() {
  static const std::vector<Field> f = {
      {"name", Kind::string, "run name (used in file names and tables)", "run"},
      {"description", Kind::string, "free text: what the run tests; stored with the run", ""},
      {"seed", Kind::integer, "seed of every random choice (init, data, noise, random masks)", 1, 0, 9.007e15},
      {"workers", Kind::integer, "number of data-parallel workers W", 4, 1, 1024},
      {"steps", Kind::integer, "optimizer steps T", 200, 1, 1e9},
      {"model", Kind::object, "model section", json::object()},
      {"data", Kind::object, "data section (gpt models only)", json::object()},
      {"optimizer", Kind::object, "optimizer section", json::object()},
      {"network", Kind::object, "network model for modelled communication time", json::object()},
      {"eval", Kind::object, "validation section (gpt models only)", json::object()},
      {"log", Kind::object, "logging section", json::object()},
  };
  return f;
}

const std::vector<Field>& model_fields() {
  static const std::vector<Field> f = {
      {"type", Kind::string, "gpt, replay (gradients from a trace file) or quadratic (noisy quadratic)", "gpt", -kInf,
       kInf, false, false, {"gpt", "replay", "quadratic"}},
      {"n_layer", Kind::integer, "gpt: transformer blocks", 2, 1, 64},
      {"n_head", Kind::integer, "gpt: attention heads (must divide n_embd)", 4, 1, 64},
      {"n_embd", Kind::integer, "gpt: embedding width", 64, 1, 4096},
      {"block_size", Kind::integer, "gpt: sequence length T", 64, 1, 4096},
      {"vocab_size", Kind::integer, "gpt: vocabulary (256 for bytes, 50257 for GPT-2 tokens)", 256, 2, 1 << 20},
      {"path", Kind::string, "replay: trace file (HDF5), relative to the config file", nullptr},
      {"size", Kind::integer, "quadratic: number of parameters", 65536, 64, 4e9},
      {"noise", Kind::number, "quadratic: gradient noise sigma", 0.5, 0, kInf},
      {"curvature_tail", Kind::number, "quadratic: Pareto shape of the curvature (smaller = heavier tail)", 1.0, 0, kInf,
       true},
  };
  return f;
}

const std::vector<Field>& data_fields() {
  static const std::vector<Field> f = {
      {"type", Kind::string, "synthetic (built-in Markov corpus), text (bytes of a file) or tokens (.bin shards)",
       "synthetic", -kInf, kInf, false, false, {"synthetic", "text", "tokens"}},
      {"path", Kind::string, "text/tokens: the file, relative to the config file", nullptr},
      {"format", Kind::string, "tokens: nanogpt (raw uint16), llmc (256-int32 header) or auto (by header magic)",
       "auto", -kInf, kInf, false, false, {"auto", "nanogpt", "llmc"}},
      {"batch_size", Kind::integer, "sequences per worker per step", 8, 1, 1 << 20},
      {"val_fraction", Kind::number, "fraction of the tokens held out for validation", 0.1, 0, 0.9, true},
      {"tokens", Kind::integer, "synthetic: corpus length in tokens", 1000000, 1000, 1e10},
      {"successors", Kind::integer, "synthetic: favoured successors per state", 4, 1, 1 << 20},
      {"concentration", Kind::number, "synthetic: probability mass on the favoured successors", 0.9, 0, 1, false, true},
  };
  return f;
}

const std::vector<Field>& optimizer_fields() {
  static const std::vector<Field> f = {
      {"type", Kind::string, "adamw, adams (dense), scape, topk_ef (raw-gradient top-k with error feedback)", "scape",
       -kInf, kInf, false, false, {"adamw", "adams", "scape", "topk_ef"}},
      {"lr", Kind::number, "peak learning rate", 6e-4, 0, kInf, true},
      {"min_lr", Kind::number, "final learning rate of the cosine schedule (default lr/10)", nullptr, 0, kInf},
      {"warmup_steps", Kind::integer, "linear warm-up steps", 0, 0, 1e9},
      {"betas", Kind::betas, "[beta1, beta2]", json::array({0.9, 0.95})},
      {"eps", Kind::number, "epsilon of the denominator", 1e-8, 0, kInf, true},
      {"weight_decay", Kind::number, "decoupled weight decay on flagged tensors", 0.1, 0, kInf},
      {"bias_correction", Kind::boolean, "Adam bias correction", true},
      {"sparsity", Kind::number, "scape/topk_ef: fraction of coordinates not sent (density = 1 - sparsity)", 0.99, 0,
       1, false, true},
      {"sharded", Kind::boolean, "distributed optimizer state (default true; false for topk_ef)", nullptr},
      {"wire_dtype", Kind::string, "precision of gradient payloads", "fp32", -kInf, kInf, false, false,
       {"fp32", "bf16"}},
      {"param_dtype", Kind::string, "precision of parameter payloads", "fp32", -kInf, kInf, false, false,
       {"fp32", "bf16"}},
      {"inner", Kind::string, "scape/topk_ef: update rule", "adams", -kInf, kInf, false, false, {"adams", "adamw"}},
      {"update", Kind::string, "scape: masked or dense update", "masked", -kInf, kInf, false, false,
       {"masked", "dense"}},
      {"mask_statistic", Kind::string, "scape: what top-k ranks", "first_moment", -kInf, kInf, false, false,
       {"first_moment", "gradient", "momentum_only", "random"}},
      {"mask_partition", Kind::string, "scape: per-owner shards or union of local masks", "partitioned", -kInf, kInf,
       false, false, {"partitioned", "local_union"}},
      {"mask_lag", Kind::integer, "scape: 1 = mask computed one step ahead, 0 = blocking", 1, 0, 1},
      {"second_moment", Kind::string, "scape: one synchronized buffer or two collectives", "single_buffer", -kInf,
       kInf, false, false, {"single_buffer", "two_collectives"}},
      {"residual", Kind::boolean, "error feedback (keep undelivered gradient)", true},
      {"density_warmup", Kind::integer, "steps of exponential density decay from 1 (0 = off)", 0, 0, 1e9},
      {"device", Kind::string, "scape: where the optimizer's kernels and state live (cuda needs a CUDA build and GPU)",
       "cpu", -kInf, kInf, false, false, {"cpu", "cuda"}},
      {"residual_offload", Kind::boolean,
       "scape: keep the residual in pinned host memory, streamed through two device chunks", false},
      {"offload_chunk", Kind::integer, "scape: elements per device chunk of the offloaded residual", 4194304, 1024,
       1073741824},
  };
  return f;
}

const std::vector<Field>& network_fields() {
  static const std::vector<Field> f = {
      {"preset", Kind::string, "ib_ndr400, nvlink_h100, pcie_gen5, eth_100g or loopback (docs/network.md)",
       "ib_ndr400"},
      {"alpha_us", Kind::number, "latency per message step in microseconds (overrides the preset)", nullptr, 0, kInf},
      {"bandwidth_GBps", Kind::number, "per-worker bandwidth in GB/s (overrides the preset)", nullptr, 0, kInf, true},
  };
  return f;
}

const std::vector<Field>& eval_fields() {
  static const std::vector<Field> f = {
      {"interval", Kind::integer, "steps between validation evaluations (the last step always evaluates)", 50, 1, 1e9},
      {"batches", Kind::integer, "validation batches per evaluation", 4, 1, 1e6},
  };
  return f;
}

const std::vector<Field>& log_fields() {
  static const std::vector<Field> f = {
      {"flush_interval", Kind::integer, "steps between flushes of the run file", 10, 1, 1e9},
      {"save_params", Kind::boolean, "write the final parameters to /final/params", false},
      {"oracle", Kind::boolean, "compute the mask overlap with the oracle top-k (costs a copy per worker)", true},
  };
  return f;
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::string type_name(const json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  return std::string("a ") + v.type_name();
}

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw ConfigError(path + ": " + what); }

std::string nearest(const std::string& key, const std::vector<Field>& fields) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& f : fields) {
    const std::size_t d = edit_distance(key, f.key);
    if (d < best_d) {
      best_d = d;
      best = f.key;
    }
  }
  return best_d <= std::max<std::size_t>(2, key.size() / 3) ? best : "";
}

// A section: rejects unknown keys (suggesting the nearest) and checks each value's type and range.
class Section {
 public:
  Section(const json& j, std::string path, const std::vector<Field>& fields) : j_(j), path_(std::move(path)), fields_(fields) {
    if (!j.is_object()) fail(path_.empty() ? "config" : path_, "expected an object, got " + type_name(j));
    for (const auto& [key, value] : j.items()) {
      if (find(key) == nullptr) {
        std::string valid;
        for (const auto& f : fields) valid += (valid.empty() ? "" : ", ") + std::string(f.key);
        const std::string guess = nearest(key, fields);
        fail(join(path_, key), "unknown key" + (guess.empty() ? "" : " (did you mean '" + guess + "'?)") +
                                    "; valid keys: " + valid);
      }
      check(key, value);
    }
  }

  bool has(const char* key) const { return j_.contains(key); }
  // The value given, or the default.
  json get(const char* key) const {
    if (j_.contains(key)) return j_.at(key);
    return find(key)->default_value;
  }
  std::string path(const char* key) const { return join(path_, key); }
  void forbid(const char* key, const std::string& why) const {
    if (has(key)) fail(path(key), why);
  }

 private:
  const Field* find(const std::string& key) const {
    for (const auto& f : fields_) {
      if (key == f.key) return &f;
    }
    return nullptr;
  }

  void check(const std::string& key, const json& v) const {
    const Field& f = *find(key);
    const std::string p = join(path_, key);
    switch (f.kind) {
      case Kind::integer:
        if (!v.is_number_integer() && !v.is_number_unsigned()) fail(p, "expected an integer, got " + type_name(v) + " " + v.dump());
        check_range(p, f, v);
        break;
      case Kind::number:
        if (!v.is_number()) fail(p, "expected a number, got " + type_name(v) + " " + v.dump());
        check_range(p, f, v);
        break;
      case Kind::boolean:
        if (!v.is_boolean()) fail(p, "expected true or false, got " + type_name(v) + " " + v.dump());
        break;
      case Kind::string:
        if (!v.is_string()) fail(p, "expected a string, got " + type_name(v) + " " + v.dump());
        if (!f.choices.empty() &&
            std::find(f.choices.begin(), f.choices.end(), v.get<std::string>()) == f.choices.end()) {
          std::string list;
          for (const auto& c : f.choices) list += (list.empty() ? "" : ", ") + c;
          fail(p, "unknown value " + v.dump() + " (expected one of " + list + ")");
        }
        break;
      case Kind::betas:
        if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
          fail(p, "expected [beta1, beta2], two numbers, got " + v.dump());
        }
        for (int i = 0; i < 2; ++i) {
          const double b = v[static_cast<std::size_t>(i)].get<double>();
          if (!(b >= 0 && b < 1)) fail(p + "[" + std::to_string(i) + "]", v[static_cast<std::size_t>(i)].dump() + " is out of range [0, 1)");
        }
        break;
      case Kind::object:
        if (!v.is_object()) fail(p, "expected an object, got " + type_name(v));
        break;
    }
  }

  static void check_range(const std::string& p, const Field& f, const json& v) {
    const double x = v.get<double>();
    const bool low = f.exclusive_minimum ? !(x > f.minimum) : !(x >= f.minimum);
    const bool high = f.exclusive_maximum ? !(x < f.maximum) : !(x <= f.maximum);
    if (low || high || !std::isfinite(x)) {
      std::ostringstream os;
      os << v.dump() << " is out of range " << (f.exclusive_minimum ? "(" : "[") << f.minimum << ", "
         << f.maximum << (f.exclusive_maximum ? ")" : "]");
      fail(p, os.str());
    }
  }

  const json& j_;
  std::string path_;
  const std::vector<Field>& fields_;
};

std::filesystem::path resolve_path(const std::string& p, const std::filesystem::path& base_dir) {
  std::filesystem::path path(p);
  if (path.is_relative()) path = base_dir / path;
  return path.lexically_normal();
}

const json kEmpty = json::object();

const json& section_json(const json& j, const char* key) { return j.contains(key) ? j.at(key) : kEmpty; }

ModelSection parse_model(const json& j) {
  const Section s(j, "model", model_fields());
  ModelSection m;
  m.type = s.get("type").get<std::string>();
  const bool gpt = m.type == "gpt", replay = m.type == "replay", quadratic = m.type == "quadratic";
  for (const char* k : {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"}) {
    if (!gpt) s.forbid(k, "only valid for model.type \"gpt\"");
  }
  if (!replay) s.forbid("path", "only valid for model.type \"replay\"");
  for (const char* k : {"size", "noise", "curvature_tail"}) {
    if (!quadratic) s.forbid(k, "only valid for model.type \"quadratic\"");
  }
  m.n_layer = s.get("n_layer").get<int>();
  m.n_head = s.get("n_head").get<int>();
  m.n_embd = s.get("n_embd").get<int>();
  m.block_size = s.get("block_size").get<int>();
  m.vocab_size = s.get("vocab_size").get<int>();
  if (gpt && m.n_embd % m.n_head != 0) {
    fail("model.n_head", std::to_string(m.n_head) + " does not divide model.n_embd = " + std::to_string(m.n_embd));
  }
  if (replay) {
    if (!s.has("path")) fail("model.path", "required for model.type \"replay\"");
    m.path = s.get("path").get<std::string>();
  }
  m.size = s.get("size").get<std::int64_t>();
  m.noise = s.get("noise").get<double>();
  m.curvature_tail = s.get("curvature_tail").get<double>();
  return m;
}

DataSection parse_data(const json& j, const std::filesystem::path& base_dir) {
  const Section s(j, "data", data_fields());
  DataSection d;
  d.type = s.get("type").get<std::string>();
  if (d.type == "synthetic") {
    s.forbid("path", "not used by data.type \"synthetic\"");
  } else {
    if (!s.has("path")) fail("data.path", "required for data.type \"" + d.type + "\"");
    d.path = resolve_path(s.get("path").get<std::string>(), base_dir);
    for (const char* k : {"tokens", "successors", "concentration"}) s.forbid(k, "only valid for data.type \"synthetic\"");
  }
  if (d.type != "tokens") s.forbid("format", "only valid for data.type \"tokens\"");
  d.format = s.get("format").get<std::string>();
  d.batch_size = s.get("batch_size").get<int>();
  d.val_fraction = s.get("val_fraction").get<double>();
  d.tokens = s.get("tokens").get<std::int64_t>();
  d.successors = s.get("successors").get<int>();
  d.concentration = s.get("concentration").get<double>();
  return d;
}

OptimizerConfig parse_optimizer(const json& j, std::uint64_t seed) {
  const Section s(j, "optimizer", optimizer_fields());
  OptimizerConfig c;
  c.type = parse_optimizer_type(s.get("type").get<std::string>());
  c.lr = s.get("lr").get<double>();
  c.min_lr = s.has("min_lr") ? s.get("min_lr").get<double>() : -1.0;
  c.warmup_steps = s.get("warmup_steps").get<int>();
  const json betas = s.get("betas");
  c.beta1 = betas[0].get<double>();
  c.beta2 = betas[1].get<double>();
  c.eps = s.get("eps").get<double>();
  c.weight_decay = s.get("weight_decay").get<double>();
  c.bias_correction = s.get("bias_correction").get<bool>();
  c.sparsity = s.get("sparsity").get<double>();
  c.sharded = s.has("sharded") ? s.get("sharded").get<bool>() : c.type != OptimizerType::topk_ef;
  c.wire_dtype = parse_wire_type(s.get("wire_dtype").get<std::string>(), "optimizer.wire_dtype");
  c.param_dtype = parse_wire_type(s.get("param_dtype").get<std::string>(), "optimizer.param_dtype");
  c.inner = parse_inner_rule(s.get("inner").get<std::string>());
  c.update = parse_update_mode(s.get("update").get<std::string>());
  c.mask_statistic = parse_mask_statistic(s.get("mask_statistic").get<std::string>());
  c.mask_partition = parse_mask_partition(s.get("mask_partition").get<std::string>());
  c.mask_lag = s.get("mask_lag").get<int>();
  c.second_moment = parse_second_moment(s.get("second_moment").get<std::string>());
  c.residual = s.get("residual").get<bool>();
  c.density_warmup = s.get("density_warmup").get<int>();
  c.device = kernels::parse_device_kind(s.get("device").get<std::string>(), "optimizer.device");
  c.residual_offload = s.get("residual_offload").get<bool>();
  c.offload_chunk = s.get("offload_chunk").get<std::size_t>();
  c.seed = seed;
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  return c;
}

// Switches an optimizer type never reads are left out of the resolved config (as model and data
// keys of other types are), so configs that train identically share one run id: the dense point
// of a sweep over sparsity runs once.
void drop_inapplicable_optimizer_keys(OptimizerType type, json& optimizer) {
  static const char* const kScapeOnly[] = {"update", "mask_statistic", "mask_partition", "mask_lag", "second_moment",
                                           "device", "residual_offload", "offload_chunk"};
  static const char* const kSparseOnly[] = {"sparsity", "inner", "residual", "density_warmup"};
  if (type == OptimizerType::scape) return;
  for (const char* key : kScapeOnly) optimizer.erase(key);
  if (type == OptimizerType::topk_ef) return;
  for (const char* key : kSparseOnly) optimizer.erase(key);
}

NetworkSection parse_network(const json& j) {
  const Section s(j, "network", network_fields());
  NetworkSection n;
  const bool explicit_link = s.has("alpha_us") && s.has("bandwidth_GBps");
  if (!s.has("preset") && (s.has("alpha_us") != s.has("bandwidth_GBps"))) {
    fail(s.has("alpha_us") ? "network.bandwidth_GBps" : "network.alpha_us",
         "required with the other link figure when no preset is named");
  }
  if (s.has("preset") || !explicit_link) {
    n.preset = s.get("preset").get<std::string>();
    try {
      const auto& p = sim::find_network_preset(n.preset, "network.preset");
      n.alpha_us = p.alpha_us;
      n.bandwidth_GBps = p.bandwidth_GBps;
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what());
    }
  } else {
    n.preset = "";
  }
  if (s.has("alpha_us")) n.alpha_us = s.get("alpha_us").get<double>();
  if (s.has("bandwidth_GBps")) n.bandwidth_GBps = s.get("bandwidth_GBps").get<double>();
  return n;
}

json field_schema(const Field& f) {
  json s;
  switch (f.kind) {
    case Kind::integer: s["type"] = "integer"; break;
    case Kind::number: s["type"] = "number"; break;
    case Kind::boolean: s["type"] = "boolean"; break;
    case Kind::string: s["type"] = "string"; break;
    case Kind::object: s["type"] = "object"; break;
    case Kind::betas:
      s = {{"type", "array"}, {"items", {{"type", "number"}, {"minimum", 0}, {"exclusiveMaximum", 1}}},
           {"minItems", 2}, {"maxItems", 2}};
      break;
  }
  s["description"] = f.description;
  if (!f.default_value.is_null() && f.kind != Kind::object) s["default"] = f.default_value;
  if (f.kind == Kind::integer || f.kind == Kind::number) {
    if (std::isfinite(f.minimum)) s[f.exclusive_minimum ? "exclusiveMinimum" : "minimum"] = f.minimum;
    if (std::isfinite(f.maximum)) s[f.exclusive_maximum ? "exclusiveMaximum" : "maximum"] = f.maximum;
  }
  if (!f.choices.empty()) s["enum"] = f.choices;
  return s;
}

json section_schema(const std::vector<Field>& fields) {
  json props = json::object();
  for (const auto& f : fields) props[f.key] = field_schema(f);
  return {{"type", "object"}, {"additionalProperties", false}, {"properties", props}};
}

}  // namespace

NetworkModel NetworkSection::model() const { return sim::to_network_model(alpha_us, bandwidth_GBps); }

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    prev.swap(cur);
  }
  return prev[b.size()];
}

ExperimentConfig parse_experiment(const json& j, const std::filesystem::path& base_dir) {
  const Section top(j, "", top_fields());
  ExperimentConfig c;
  c.name = top.get("name").get<std::string>();
  c.description = top.get("description").get<std::string>();
  c.seed = top.get("seed").get<std::uint64_t>();
  c.workers = top.get("workers").get<int>();
  c.steps = top.get("steps").get<int>();
  c.model = parse_model(section_json(j, "model"));
  if (c.has_data()) {
    c.data = parse_data(section_json(j, "data"), base_dir);
    const Section eval(section_json(j, "eval"), "eval", eval_fields());
    c.eval.interval = eval.get("interval").get<int>();
    c.eval.batches = eval.get("batches").get<int>();
  } else {
    top.forbid("data", "model.type \"" + c.model.type + "\" takes no data section");
    top.forbid("eval", "model.type \"" + c.model.type + "\" has no validation loss; remove the eval section");
  }
  if (c.model.type == "replay") c.model.path = resolve_path(c.model.path.string(), base_dir);
  c.optimizer = parse_optimizer(section_json(j, "optimizer"), c.seed);
  c.network = parse_network(section_json(j, "network"));
  const Section log(section_json(j, "log"), "log", log_fields());
  c.log.flush_interval = log.get("flush_interval").get<int>();
  c.log.save_params = log.get("save_params").get<bool>();
  c.log.oracle = log.get("oracle").get<bool>();
  return c;
}

json ExperimentConfig::to_json() const {
  json j;
  j["name"] = name;
  j["description"] = description;
  j["seed"] = seed;
  j["workers"] = workers;
  j["steps"] = steps;
  json m = {{"type", model.type}};
  if (model.type == "gpt") {
    m.update({{"n_layer", model.n_layer}, {"n_head", model.n_head}, {"n_embd", model.n_embd},
              {"block_size", model.block_size}, {"vocab_size", model.vocab_size}});
  } else if (model.type == "replay") {
    m["path"] = model.path.string();
  } else {
    m.update({{"size", model.size}, {"noise", model.noise}, {"curvature_tail", model.curvature_tail}});
  }
  j["model"] = m;
  if (has_data()) {
    json d = {{"type", data.type}, {"batch_size", data.batch_size}, {"val_fraction", data.val_fraction}};
    if (data.type == "synthetic") {
      d.update({{"tokens", data.tokens}, {"successors", data.successors}, {"concentration", data.concentration}});
    } else {
      d["path"] = data.path.string();
    }
    if (data.type == "tokens") d["format"] = data.format;
    j["data"] = d;
    j["eval"] = {{"interval", eval.interval}, {"batches", eval.batches}};
  }
  const auto& o = optimizer;
  j["optimizer"] = {{"type", to_string(o.type)},
                    {"lr", o.lr},
                    {"min_lr", o.resolved_min_lr()},
                    {"warmup_steps", o.warmup_steps},
                    {"betas", {o.beta1, o.beta2}},
                    {"eps", o.eps},
                    {"weight_decay", o.weight_decay},
                    {"bias_correction", o.bias_correction},
                    {"sparsity", o.sparsity},
                    {"sharded", o.sharded},
                    {"wire_dtype", to_string(o.wire_dtype)},
                    {"param_dtype", to_string(o.param_dtype)},
                    {"inner", to_string(o.inner)},
                    {"update", to_string(o.update)},
                    {"mask_statistic", to_string(o.mask_statistic)},
                    {"mask_partition", to_string(o.mask_partition)},
                    {"mask_lag", o.mask_lag},
                    {"second_moment", to_string(o.second_moment)},
                    {"residual", o.residual},
                    {"density_warmup", o.density_warmup},
                    {"device", kernels::to_string(o.device)},
                    {"residual_offload", o.residual_offload},
                    {"offload_chunk", o.offload_chunk}};
  drop_inapplicable_optimizer_keys(o.type, j["optimizer"]);
  json n = {{"alpha_us", network.alpha_us}, {"bandwidth_GBps", network.bandwidth_GBps}};
  if (!network.preset.empty()) n["preset"] = network.preset;
  j["network"] = n;
  j["log"] = {{"flush_interval", log.flush_interval}, {"save_params", log.save_params}, {"oracle", log.oracle}};
  return j;
}

json read_json_file(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) throw ConfigError(path.string() + ": is a directory, expected a JSON file");
  std::ifstream in(path);
  if (!in) throw ConfigError(path.string() + ": cannot open the file");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError(path.string() + ": invalid JSON: " + e.what());
  }
}

void apply_override(json& j, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError("--set " + assignment + ": expected key.path=value");
  }
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = text;  // not JSON: a plain string such as scape or first_moment
  }
  json* node = &j;
  std::size_t start = 0;
  while (true) {
    const auto dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw ConfigError("--set " + assignment + ": empty component in key '" + key + "'");
    if (!node->is_object()) throw ConfigError("--set " + assignment + ": '" + key.substr(0, start - 1) + "' is not an object");
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    node = &(*node)[part];
    if (node->is_null()) *node = json::object();
    start = dot + 1;
  }
}

std::string run_id(const json& resolved) {
  // FNV-1a over the canonical dump (nlohmann sorts object keys), then a final mix.
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : resolved.dump()) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

json experiment_schema() {
  json schema = section_schema(top_fields());
  schema["$schema"] = "https://json-schema.org/draft/2020-12/schema";
  schema["title"] = "scape experiment";
  schema["properties"]["model"] = section_schema(model_fields());
  schema["properties"]["data"] = section_schema(data_fields());
  schema["properties"]["optimizer"] = section_schema(optimizer_fields());
  schema["properties"]["network"] = section_schema(network_fields());
  schema["properties"]["eval"] = section_schema(eval_fields());
  schema["properties"]["log"] = section_schema(log_fields());
  return schema;
}

std::vector<SweepPoint> expand_sweep(const json& sweep, const std::filesystem::path& base_dir) {
  if (!sweep.is_object()) throw ConfigError("sweep: expected an object with base or base_file, and grid");
  for (const auto& [key, value] : sweep.items()) {
    if (key != "base" && key != "base_file" && key != "grid" && key != "points" && key != "description" &&
        key != "name") {
      throw ConfigError("sweep." + key + ": unknown key; valid keys: name, description, base, base_file, grid, points");
    }
  }
  if (sweep.contains("base") == sweep.contains("base_file")) {
    throw ConfigError("sweep: give exactly one of base and base_file");
  }
  json base = sweep.contains("base") ? sweep.at("base")
                                     : read_json_file(resolve_path(sweep.at("base_file").get<std::string>(), base_dir));
  if (!sweep.contains("grid") && !sweep.contains("points")) {
    throw ConfigError("sweep: give a grid {\"dotted.key\": [values, ...]} and/or points [{\"dotted.key\": value}, ...]");
  }
  if (sweep.contains("grid") && !sweep.at("grid").is_object()) {
    throw ConfigError("sweep.grid: expected an object {\"dotted.key\": [values, ...]}");
  }
  std::vector<SweepPoint> points{{base, {}}};
  if (sweep.contains("points")) {
    const json& list = sweep.at("points");
    if (!list.is_array() || list.empty()) throw ConfigError("sweep.points: expected a non-empty array of objects");
    std::vector<SweepPoint> expanded;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_object()) throw ConfigError("sweep.points[" + std::to_string(i) + "]: expected an object");
      SweepPoint q{base, {}};
      for (const auto& [key, value] : list[i].items()) {
        apply_override(q.config, key + "=" + value.dump());
        q.assignment.emplace_back(key, value);
      }
      expanded.push_back(std::move(q));
    }
    points = std::move(expanded);
  }
  const json no_grid = json::object();
  for (const auto& [key, values] : (sweep.contains("grid") ? sweep.at("grid") : no_grid).items()) {
    if (!values.is_array() || values.empty()) throw ConfigError("sweep.grid." + key + ": expected a non-empty array of values");
    std::vector<SweepPoint> next;
    for (const auto& p : points) {
      for (const auto& v : values) {
        SweepPoint q = p;
        apply_override(q.config, key + "=" + v.dump());
        q.assignment.emplace_back(key, v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  return points;
}

}  // namespace scape::experiments
