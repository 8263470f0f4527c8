// Strict parsing of prediction configs. Each section names its keys once; unknown keys get
// a "did you mean" from the experiment-config edit distance, and every getter checks type and
// range and names the JSON path in its error.
#include "predict/predict_config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "experiments/config.hpp"
#include "sim/network_presets.hpp"

namespace scape::predict {
namespace {

using nlohmann::json;
using experiments::ConfigError;

constexpr double kInf = std::numeric_limits<double>::infinity();

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw ConfigError(path + ": " + what); }

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::string type_name(const json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  return std::string("a ") + v.type_name();
}

std::string list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Rethrows an std::invalid_argument of a shared lookup (presets, enums) as a ConfigError.
template <typename F>
auto config_error(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}

class Section {
 public:
  Section(const json& j, std::string path, std::vector<std::string> keys)
      : j_(j), path_(std::move(path)), keys_(std::move(keys)) {
    if (!j.is_object()) fail(path_.empty() ? "config" : path_, "expected an object, got " + type_name(j));
    for (const auto& [key, value] : j.items()) {
      if (std::find(keys_.begin(), keys_.end(), key) != keys_.end()) continue;
      const std::string guess = nearest(key);
      fail(join(path_, key), "unknown key" + (guess.empty() ? "" : " (did you mean '" + guess + "'?)") +
                                 "; valid keys: " + list(keys_));
    }
  }

  bool has(const char* key) const { return j_.contains(key); }
  const json& raw(const char* key) const { return j_.at(key); }
  std::string path(const char* key) const { return join(path_, key); }
  void forbid(const char* key, const std::string& why) const {
    if (has(key)) fail(path(key), why);
  }
  void require(const char* key, const std::string& when) const {
    if (!has(key)) fail(path(key), "required " + when);
  }

  std::int64_t integer(const char* key, std::int64_t fallback, double lo, double hi) const {
    if (!has(key)) return fallback;
    const json& v = raw(key);
    if (!v.is_number_integer() && !v.is_number_unsigned()) {
      fail(path(key), "expected an integer, got " + type_name(v) + " " + v.dump());
    }
    check_range(key, v.get<double>(), lo, hi, false);
    return v.get<std::int64_t>();
  }
  double number(const char* key, double fallback, double lo, double hi, bool exclusive_lo) const {
    if (!has(key)) return fallback;
    const json& v = raw(key);
    if (!v.is_number()) fail(path(key), "expected a number, got " + type_name(v) + " " + v.dump());
    check_range(key, v.get<double>(), lo, hi, exclusive_lo);
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = raw(key);
    if (!v.is_boolean()) fail(path(key), "expected true or false, got " + type_name(v) + " " + v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& fallback, const std::vector<std::string>& choices = {}) const {
    if (!has(key)) return fallback;
    const json& v = raw(key);
    if (!v.is_string()) fail(path(key), "expected a string, got " + type_name(v) + " " + v.dump());
    const auto s = v.get<std::string>();
    if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
      fail(path(key), "unknown value " + v.dump() + " (expected one of " + list(choices) + ")");
    }
    return s;
  }
  const json& object(const char* key) const {
    static const json empty = json::object();
    return has(key) ? raw(key) : empty;
  }

 private:
  void check_range(const char* key, double x, double lo, double hi, bool exclusive_lo) const {
    const bool low = exclusive_lo ? !(x > lo) : !(x >= lo);
    if (low || !(x <= hi) || !std::isfinite(x)) {
      std::ostringstream os;
      os << raw(key).dump() << " is out of range " << (exclusive_lo ? "(" : "[") << lo << ", " << hi << "]";
      fail(path(key), os.str());
    }
  }
  std::string nearest(const std::string& key) const {
    std::string best;
    std::size_t best_d = std::numeric_limits<std::size_t>::max();
    for (const auto& k : keys_) {
      const std::size_t d = experiments::edit_distance(key, k);
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    return best_d <= std::max<std::size_t>(2, key.size() / 3) ? best : "";
  }

  const json& j_;
  std::string path_;
  std::vector<std::string> keys_;
};

std::vector<std::string> names_of(const auto& presets) {
  std::vector<std::string> out;
  for (const auto& p : presets) out.emplace_back(p.name);
  return out;
}

void check_model_shape(const ModelSpec& m) {
  if (m.n_embd % m.n_head != 0) {
    fail("model.n_head", std::to_string(m.n_head) + " does not divide model.n_embd = " + std::to_string(m.n_embd));
  }
  if (m.n_head % m.n_kv_head != 0) {
    fail("model.n_kv_head",
         std::to_string(m.n_kv_head) + " does not divide model.n_head = " + std::to_string(m.n_head));
  }
  if (m.family == Family::gpt2 && m.n_kv_head != m.n_head) {
    fail("model.n_kv_head", "grouped-query attention is only defined for family llama");
  }
}

ModelSpec parse_model(const Section& s, std::string& preset) {
  ModelSpec m;
  preset = s.string("preset", "");
  if (!preset.empty()) {
    m = config_error([&] { return find_model_preset(preset, "model.preset").spec; });
  } else {
    for (const char* k : {"family", "n_layer", "n_embd", "n_head", "vocab_size"}) {
      s.require(k, "when no model.preset is given (presets: " + list(names_of(model_presets())) + ")");
    }
  }
  if (s.has("family")) {
    m.family = config_error([&] { return parse_family(s.string("family", ""), "model.family"); });
    if (preset.empty()) {
      m.context = m.family == Family::gpt2 ? 1024 : 2048;
      m.tied_embeddings = m.family == Family::gpt2;
    }
  }
  m.n_layer = static_cast<int>(s.integer("n_layer", m.n_layer, 1, 10000));
  m.n_embd = static_cast<int>(s.integer("n_embd", m.n_embd, 1, 1 << 20));
  m.n_head = static_cast<int>(s.integer("n_head", m.n_head, 1, 1 << 16));
  // A changed width, head count or family re-derives the defaults that follow from them
  // (MLP width, key-value heads) unless those are given too.
  if (s.has("n_embd") || s.has("family")) {
    m.ffn_hidden = m.family == Family::gpt2 ? 4 * static_cast<std::int64_t>(m.n_embd) : llama_ffn_hidden(m.n_embd);
  }
  if (s.has("n_head") || s.has("family")) m.n_kv_head = m.n_head;
  m.n_kv_head = static_cast<int>(s.integer("n_kv_head", m.n_kv_head, 1, 1 << 16));
  m.ffn_hidden = s.integer("ffn_hidden", m.ffn_hidden, 1, 1e9);
  m.vocab_size = s.integer("vocab_size", m.vocab_size, 2, 1e9);
  m.context = static_cast<int>(s.integer("context", m.context, 1, 1e8));
  m.tied_embeddings = s.boolean("tied_embeddings", m.tied_embeddings);
  check_model_shape(m);
  return m;
}

LinkSpec parse_link(const json& j, const std::string& path, const char* default_preset) {
  const Section s(j, path, {"preset", "alpha_us", "bandwidth_GBps"});
  LinkSpec l;
  const bool both = s.has("alpha_us") && s.has("bandwidth_GBps");
  if (s.has("preset") || !both) {
    l.preset = s.string("preset", default_preset);
    const auto& p = config_error(
        [&]() -> const sim::NetworkPreset& { return sim::find_network_preset(l.preset, s.path("preset")); });
    l.alpha_us = p.alpha_us;
    l.bandwidth_GBps = p.bandwidth_GBps;
  }
  l.alpha_us = s.number("alpha_us", l.alpha_us, 0, kInf, false);
  l.bandwidth_GBps = s.number("bandwidth_GBps", l.bandwidth_GBps, 0, kInf, true);
  return l;
}

GpuSpec parse_gpu(const Section& s) {
  GpuSpec g;
  const bool both = s.has("peak_TFLOPs") && s.has("memory_bandwidth_TBps");
  if (s.has("preset") || !both) {
    g.preset = s.string("preset", "h100");
    const auto& p = config_error([&]() -> const GpuPreset& { return find_gpu_preset(g.preset, "gpu.preset"); });
    g.peak_TFLOPs = p.peak_bf16_TFLOPs;
    g.memory_TBps = p.memory_TBps;
  }
  g.peak_TFLOPs = s.number("peak_TFLOPs", g.peak_TFLOPs, 0, kInf, true);
  g.memory_TBps = s.number("memory_bandwidth_TBps", g.memory_TBps, 0, kInf, true);
  g.mfu = s.number("mfu", kDefaultMfu, 0, 1, true);
  return g;
}

OverlapModel parse_overlap(const Section& s) {
  OverlapModel o;
  o.grad_reduce = s.boolean("grad_reduce", o.grad_reduce);
  o.param_gather = s.boolean("param_gather", o.param_gather);
  o.sparse_reduce = s.boolean("sparse_reduce", o.sparse_reduce);
  o.mask_gather = s.boolean("mask_gather", o.mask_gather);
  o.bucket_MB = s.number("bucket_MB", o.bucket_MB, 0, kInf, true);
  return o;
}

// The optimizer section of a run config, parsed by the run-config parser so that every key,
// default and check is the same; `path` renames the section in its messages.
OptimizerConfig parse_optimizer_section(const json& j, const std::string& path) {
  const json run = {{"model", {{"type", "quadratic"}}}, {"optimizer", j}};
  try {
    return experiments::parse_experiment(run, ".").optimizer;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    if (path == "optimizer" || what.rfind("optimizer", 0) != 0) throw;
    throw ConfigError(path + what.substr(std::string("optimizer").size()));
  }
}

std::vector<int> parse_workers(const Section& top) {
  top.require("workers", "(the list of worker counts to evaluate)");
  const json& list_json = top.raw("workers");
  if (!list_json.is_array() || list_json.empty()) {
    fail("workers", "expected a non-empty array of integers, got " + list_json.dump());
  }
  std::vector<int> out;
  for (std::size_t i = 0; i < list_json.size(); ++i) {
    const json& v = list_json[i];
    const std::string p = "workers[" + std::to_string(i) + "]";
    if (!v.is_number_integer() && !v.is_number_unsigned()) {
      fail(p, "expected an integer, got " + type_name(v) + " " + v.dump());
    }
    const std::int64_t w = v.get<std::int64_t>();
    if (w < 1 || w > 1000000) fail(p, v.dump() + " is out of range [1, 1000000]");
    out.push_back(static_cast<int>(w));
  }
  return out;
}

void check_placement(const PredictConfig& c) {
  for (std::size_t i = 0; i < c.workers.size(); ++i) {
    const int w = c.workers[i];
    if (w > c.gpus_per_node && w % c.gpus_per_node != 0) {
      fail("workers[" + std::to_string(i) + "]", std::to_string(w) + " is not a multiple of network.gpus_per_node = " +
                                                    std::to_string(c.gpus_per_node));
    }
  }
}

BatchSpec parse_batch(const Section& s, const PredictConfig& c) {
  BatchSpec b;
  b.scaling = s.string("scaling", "strong", {"strong", "weak"}) == "weak" ? Scaling::weak : Scaling::strong;
  b.seq_len = static_cast<int>(s.integer("seq_len", c.model.context, 1, 1e8));
  if (c.model.family == Family::gpt2 && b.seq_len > c.model.context) {
    fail(s.path("seq_len"), std::to_string(b.seq_len) + " exceeds model.context = " + std::to_string(c.model.context) +
                                " (the rows of the position table)");
  }
  if (b.scaling == Scaling::strong) {
    s.require("global_sequences", "for strong scaling (the global batch in sequences)");
    s.forbid("per_gpu_sequences", "only valid for batch.scaling \"weak\"");
    s.forbid("reference_workers", "only valid for batch.scaling \"weak\"");
    b.global_sequences = s.integer("global_sequences", 0, 1, 1e12);
    for (std::size_t i = 0; i < c.workers.size(); ++i) {
      if (b.global_sequences % c.workers[i] != 0) {
        fail(s.path("global_sequences"),
             std::to_string(b.global_sequences) + " sequences do not split evenly over workers[" + std::to_string(i) +
                 "] = " + std::to_string(c.workers[i]) + " (strong scaling keeps the global batch)");
      }
    }
    return b;
  }
  if (s.has("per_gpu_sequences") == s.has("global_sequences")) {
    fail(s.path("per_gpu_sequences"), "weak scaling needs exactly one of batch.per_gpu_sequences and "
                                      "batch.global_sequences (with batch.reference_workers)");
  }
  if (s.has("per_gpu_sequences")) {
    s.forbid("reference_workers", "only valid with batch.global_sequences");
    b.per_gpu_sequences = s.integer("per_gpu_sequences", 0, 1, 1e12);
    return b;
  }
  const std::int64_t global = s.integer("global_sequences", 0, 1, 1e12);
  const std::int64_t reference =
      s.integer("reference_workers", *std::max_element(c.workers.begin(), c.workers.end()), 1, 1000000);
  if (global % reference != 0) {
    fail(s.path("global_sequences"),
         std::to_string(global) + " is not divisible by batch.reference_workers = " + std::to_string(reference) +
             " (weak scaling keeps global_sequences / reference_workers sequences per GPU)");
  }
  b.per_gpu_sequences = global / reference;
  return b;
}

void parse_network(const Section& s, PredictConfig& c) {
  c.gpus_per_node = static_cast<int>(s.integer("gpus_per_node", 1, 1, 1024));
  c.nics_per_node = static_cast<int>(s.integer("nics_per_node", c.gpus_per_node, 1, c.gpus_per_node));
  c.inter = parse_link(s.object("inter"), "network.inter", "ib_ndr400");
  c.intra = parse_link(s.object("intra"), "network.intra", "nvlink_h100");
}

json link_json(const LinkSpec& l) {
  json j = {{"alpha_us", l.alpha_us}, {"bandwidth_GBps", l.bandwidth_GBps}};
  if (!l.preset.empty()) j["preset"] = l.preset;
  return j;
}

json optimizer_json(const OptimizerConfig& o) {
  experiments::ExperimentConfig run;
  run.optimizer = o;
  return run.to_json()["optimizer"];
}

}  // namespace

const char* to_string(Scaling s) { return s == Scaling::strong ? "strong" : "weak"; }

double BatchSpec::sequences_per_gpu(int workers) const {
  return scaling == Scaling::strong ? static_cast<double>(global_sequences) / workers
                                    : static_cast<double>(per_gpu_sequences);
}

NetworkModel LinkSpec::model() const { return sim::to_network_model(alpha_us, bandwidth_GBps); }

Topology PredictConfig::topology() const {
  return Topology{gpus_per_node, nics_per_node, intra.model(), inter.model()};
}

OptimizerConfig default_baseline(const OptimizerConfig& c) {
  if (c.type == OptimizerType::adamw || c.type == OptimizerType::adams) return c;
  OptimizerConfig b = c;
  b.type = c.inner == InnerRule::adamw ? OptimizerType::adamw : OptimizerType::adams;
  return b;
}

PredictConfig parse_predict_config(const json& j) {
  const Section top(j, "", {"name", "description", "model", "batch", "gpu", "network", "overlap", "optimizer",
                            "baseline", "fill_in", "workers"});
  PredictConfig c;
  c.name = top.string("name", c.name);
  c.description = top.string("description", "");
  c.workers = parse_workers(top);
  top.require("model", "(a model.preset or explicit dimensions)");
  const Section model(top.raw("model"), "model",
                      {"preset", "family", "n_layer", "n_embd", "n_head", "n_kv_head", "ffn_hidden", "vocab_size",
                       "context", "tied_embeddings", "attention_flops"});
  c.model = parse_model(model, c.model_preset);
  c.attention = parse_attention_flops(model.string("attention_flops", "causal", {"causal", "full", "none"}), "");
  top.require("batch", "(batch.global_sequences or batch.per_gpu_sequences, and batch.seq_len)");
  c.batch = parse_batch(Section(top.raw("batch"), "batch",
                                {"scaling", "seq_len", "global_sequences", "per_gpu_sequences", "reference_workers"}),
                        c);
  c.gpu = parse_gpu(Section(top.object("gpu"), "gpu", {"preset", "peak_TFLOPs", "mfu", "memory_bandwidth_TBps"}));
  parse_network(Section(top.object("network"), "network", {"gpus_per_node", "nics_per_node", "inter", "intra"}), c);
  check_placement(c);
  c.overlap = parse_overlap(Section(top.object("overlap"), "overlap",
                                    {"grad_reduce", "param_gather", "sparse_reduce", "mask_gather", "bucket_MB"}));
  c.optimizer = parse_optimizer_section(top.object("optimizer"), "optimizer");
  c.baseline = top.has("baseline") ? parse_optimizer_section(top.raw("baseline"), "baseline")
                                   : default_baseline(c.optimizer);
  c.fill_in = top.number("fill_in", 1.0, 1.0, kInf, false);
  return c;
}

PredictConfig load_predict_config(const std::filesystem::path& file, const std::vector<std::string>& sets) {
  json j = experiments::read_json_file(file);
  for (const auto& s : sets) experiments::apply_override(j, s);
  return parse_predict_config(j);
}

json PredictConfig::to_json() const {
  json m = {{"family", predict::to_string(model.family)},
            {"n_layer", model.n_layer},
            {"n_embd", model.n_embd},
            {"n_head", model.n_head},
            {"n_kv_head", model.n_kv_head},
            {"ffn_hidden", model.ffn_hidden},
            {"vocab_size", model.vocab_size},
            {"context", model.context},
            {"tied_embeddings", model.tied_embeddings},
            {"attention_flops", predict::to_string(attention)}};
  if (!model_preset.empty()) m["preset"] = model_preset;
  json b = {{"scaling", predict::to_string(batch.scaling)}, {"seq_len", batch.seq_len}};
  if (batch.scaling == Scaling::strong) {
    b["global_sequences"] = batch.global_sequences;
  } else {
    b["per_gpu_sequences"] = batch.per_gpu_sequences;
  }
  json g = {{"peak_TFLOPs", gpu.peak_TFLOPs}, {"mfu", gpu.mfu}, {"memory_bandwidth_TBps", gpu.memory_TBps}};
  if (!gpu.preset.empty()) g["preset"] = gpu.preset;
  return {{"name", name},
          {"description", description},
          {"model", m},
          {"batch", b},
          {"gpu", g},
          {"network",
           {{"gpus_per_node", gpus_per_node}, {"nics_per_node", nics_per_node}, {"inter", link_json(inter)},
            {"intra", link_json(intra)}}},
          {"overlap",
           {{"grad_reduce", overlap.grad_reduce},
            {"param_gather", overlap.param_gather},
            {"sparse_reduce", overlap.sparse_reduce},
            {"mask_gather", overlap.mask_gather},
            {"bucket_MB", overlap.bucket_MB}}},
          {"optimizer", optimizer_json(optimizer)},
          {"baseline", optimizer_json(baseline)},
          {"fill_in", fill_in},
          {"workers", workers}};
}

}  // namespace scape::predict
