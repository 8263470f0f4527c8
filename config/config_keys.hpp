// The key tables of experiment configs: each key's kind, doc line, range, the types it applies
// to and the member it sets, declared once (config_keys.cpp, optimizer_keys.cpp). Defaults are read from the
// default-built structs (config.hpp, core/optimizer_config.hpp). Parsing, the resolved config, the
// JSON Schema and docs/configuration.md (tests/test_config_keys.cpp) all follow these tables.
// The ranges of optimizer keys are OptimizerConfig::validate()'s, not the table's.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "config/json_section.hpp"

namespace scape::config {

// Where a key's default comes from: the default-built struct, other keys (min_lr is lr/10;
// alpha_us follows the preset), or nowhere (a path the type needs).
enum class Default { member, derived, required };

template <typename Config>
struct Key {
  Field field;
  nlohmann::json (*read)(const Config&) = nullptr;          // the value the resolved config records
  void (*write)(Config&, const nlohmann::json&) = nullptr;  // from a value the Section checked
  Default default_from = Default::member;
};

template <typename Config>
struct KeyTable {
  explicit KeyTable(std::vector<Key<Config>> k) : keys(std::move(k)) {
    const Config defaults{};
    for (auto& key : keys) {
      if (key.default_from == Default::member && key.read != nullptr) {
        key.field.default_value = key.read(defaults);
        if (key.field.default_value.is_discarded()) key.field.default_value = false;  // a switch recorded when on
      }
      fields.push_back(key.field);
    }
  }
  std::vector<Key<Config>> keys;
  std::vector<Field> fields;  // the keys' Fields, for Section and the schema
};

const KeyTable<ExperimentConfig>& top_keys();  // the sections are objects without accessors
const KeyTable<ModelSection>& model_keys();
const KeyTable<DataSection>& data_keys();
const KeyTable<OptimizerConfig>& optimizer_keys();
const KeyTable<NetworkSection>& network_keys();
const KeyTable<TopologySection>& topology_keys();
const KeyTable<ComputeSection>& compute_keys();
const KeyTable<EvalSection>& eval_keys();
const KeyTable<LogSection>& log_keys();

// {optimizer key: [the optimizer types that read it]} for every optimizer key: the "x-applies-to"
// of the optimizer section's schema (section_schema of optimizer_keys(), as `scape schema` prints
// it), so the two agree by construction. Run files carry it as their optimizer_keys attribute
// (train/run_log.cpp), so that analysis/runs.py needs no scape binary to read them.
nlohmann::json optimizer_key_types();

// Sets every key the section gives; the others keep their default-built values. A value that
// does not fit the member's C++ type is a ConfigError naming the key.
template <typename Config>
void write_given(const Section& s, const KeyTable<Config>& table, Config& c) {
  for (const auto& k : table.keys) {
    if (k.write == nullptr || !s.has(k.field.key)) continue;
    try {
      k.write(c, s.at(k.field.key));
    } catch (const std::out_of_range& e) {
      fail(s.path(k.field.key), e.what());
    }
  }
}

// The resolved section: every key that applies to `type`, as recorded. A read that returns a
// discarded value leaves its key out (a switch recorded only when on, so that adding it left
// the run ids of older configs unchanged).
template <typename Config>
nlohmann::json read_applicable(const KeyTable<Config>& table, const Config& c, const std::string& type = "") {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : table.keys) {
    if (k.read == nullptr || !applies(k.field, type)) continue;
    nlohmann::json value = k.read(c);
    if (!value.is_discarded()) j[k.field.key] = std::move(value);
  }
  return j;
}

// Model and data sections: a key of another type is an error, and so is a missing key this
// type requires.
template <typename Config>
void check_applicable(const Section& s, const KeyTable<Config>& table, const std::string& type) {
  const std::string type_is = s.path("type") + " \"";
  for (const auto& k : table.keys) {
    if (applies(k.field, type)) continue;
    std::string valid;
    for (const auto& t : k.field.applies_to) valid += (valid.empty() ? type_is : "\" or \"") + t;
    s.forbid(k.field.key, "only valid for " + valid + "\"");
  }
  for (const auto& k : table.keys) {
    if (k.default_from == Default::required && applies(k.field, type)) {
      s.require(k.field.key, "for " + type_is + type + "\"");
    }
  }
}

}  // namespace scape::config
