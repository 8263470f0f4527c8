// The strict JSON section parser shared by experiment and prediction configs: a section is one
// JSON object checked against a list of Fields (key, kind, doc line, range, choices). Unknown
// keys (with the nearest valid key), wrong types and out-of-range values are ConfigErrors naming
// the JSON path; the same Fields give the section's JSON Schema.
#pragma once

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace scape::config {

// Invalid configuration or input: the command exits with status 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// number_pair: two numbers, whose doc line names them ("[beta1, beta2]"). integer_list: a
// non-empty array of integers, each in the range. string_list: an array of non-empty strings
// (possibly empty).
enum class Kind { integer, number, boolean, string, number_pair, integer_list, string_list, object };

struct Range {
  double minimum = -std::numeric_limits<double>::infinity();
  double maximum = std::numeric_limits<double>::infinity();
  bool exclusive_minimum = false;
  bool exclusive_maximum = false;
};

struct Field {
  const char* key;
  Kind kind;
  const char* doc;
  Range range = {};
  std::vector<std::string> choices = {};     // the accepted strings (empty: any)
  std::vector<std::string> applies_to = {};  // the section's types that read the key (empty: all)
  nlohmann::json default_value = nullptr;    // null: required, or derived from other keys
};

bool applies(const Field& f, const std::string& type);

[[noreturn]] void fail(const std::string& path, const std::string& what);
// Runs f; the std::invalid_argument of a check shared with code outside configs (validate(),
// presets, enum parsers), which names the field itself, becomes a ConfigError.
template <typename F>
auto config_error(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}
// "a, b, c"
std::string comma_list(const std::vector<std::string>& items);
// "a number", "an integer", "a string", ...: for "expected X, got Y" messages.
std::string type_name(const nlohmann::json& v);
// "an array [1,2]", "null", "a string \"x\"": what a message says a bad value was (cut at 80 characters).
std::string described(const nlohmann::json& v);
std::string join_path(const std::string& path, const std::string& key);
// Edit distance, for "did you mean" suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b);
// The field key nearest to `key`, or "" when none is close enough to be a typo of it.
std::string nearest(const std::string& key, const std::vector<Field>& fields);

// A section: the constructor rejects unknown keys and checks each given value's type and range.
// The Fields must outlive the Section.
class Section {
 public:
  Section(const nlohmann::json& j, std::string path, const std::vector<Field>& fields);

  bool has(const char* key) const { return j_.contains(key); }
  const nlohmann::json& at(const char* key) const { return j_.at(key); }
  // The value given, else the Field's default.
  nlohmann::json get(const char* key) const;
  template <typename T>
  T value_or(const char* key, const T& fallback) const {
    return has(key) ? at(key).get<T>() : fallback;
  }
  // The object given for a section key, else an empty object.
  const nlohmann::json& object(const char* key) const;
  std::string path(const char* key) const { return join_path(path_, key); }
  void forbid(const char* key, const std::string& why) const;
  void require(const char* key, const std::string& when) const;

 private:
  const Field* find(const std::string& key) const;
  void check(const Field& f, const nlohmann::json& v) const;

  const nlohmann::json& j_;
  std::string path_;
  const std::vector<Field>& fields_;
};

// JSON Schema of a section. `type_field` names the field whose choices are the types of
// applies_to; each field of such a section says the types it applies to in "x-applies-to".
nlohmann::json section_schema(const std::vector<Field>& fields, const char* type_field = nullptr);

}  // namespace scape::config
