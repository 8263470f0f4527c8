// The strict section parser and the JSON Schema of a section, from one list of Fields.
#include "config/json_section.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace scape::config {
namespace {

using nlohmann::json;

bool is_integer(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

void check_range(const std::string& p, const Field& f, const json& v) {
  const double x = v.get<double>();
  const Range& r = f.range;
  const bool low = r.exclusive_minimum ? !(x > r.minimum) : !(x >= r.minimum);
  const bool high = r.exclusive_maximum ? !(x < r.maximum) : !(x <= r.maximum);
  if (low || high || !std::isfinite(x)) {
    std::ostringstream os;
    os << v.dump() << " is out of range " << (r.exclusive_minimum ? "(" : "[") << r.minimum << ", " << r.maximum
       << (r.exclusive_maximum ? ")" : "]");
    fail(p, os.str());
  }
}

void check_integer(const std::string& p, const Field& f, const json& v) {
  if (!is_integer(v)) fail(p, "expected an integer, got " + described(v));
  check_range(p, f, v);
}

void check_integer_list(const std::string& p, const Field& f, const json& v) {
  if (!v.is_array() || v.empty()) fail(p, "expected a non-empty array of integers, got " + v.dump());
  for (std::size_t i = 0; i < v.size(); ++i) check_integer(p + "[" + std::to_string(i) + "]", f, v[i]);
}

void check_string_list(const std::string& p, const json& v) {
  if (!v.is_array()) fail(p, "expected an array of strings, got " + described(v));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().empty()) {
      fail(p + "[" + std::to_string(i) + "]",
           "expected a non-empty string, got " + described(v[i]));
    }
  }
}

void check_string(const std::string& p, const Field& f, const json& v) {
  if (!v.is_string()) fail(p, "expected a string, got " + described(v));
  const auto& c = f.choices;
  if (!c.empty() && std::find(c.begin(), c.end(), v.get<std::string>()) == c.end()) {
    fail(p, "unknown value " + v.dump() + " (expected one of " + comma_list(c) + ")");
  }
}

json type_schema(const Field& f) {
  switch (f.kind) {
    case Kind::integer: return {{"type", "integer"}};
    case Kind::number: return {{"type", "number"}};
    case Kind::boolean: return {{"type", "boolean"}};
    case Kind::string: return {{"type", "string"}};
    case Kind::object: return {{"type", "object"}};
    case Kind::number_pair:
      return {{"type", "array"}, {"items", {{"type", "number"}}}, {"minItems", 2}, {"maxItems", 2}};
    case Kind::integer_list: return {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 1}};
    case Kind::string_list: return {{"type", "array"}, {"items", {{"type", "string"}, {"minLength", 1}}}};
  }
  return json::object();
}

void add_range(json& s, const Range& r) {
  if (std::isfinite(r.minimum)) s[r.exclusive_minimum ? "exclusiveMinimum" : "minimum"] = r.minimum;
  if (std::isfinite(r.maximum)) s[r.exclusive_maximum ? "exclusiveMaximum" : "maximum"] = r.maximum;
}

json field_schema(const Field& f, const std::vector<std::string>& types) {
  json s = type_schema(f);
  s["description"] = f.doc;
  if (!f.default_value.is_null() && f.kind != Kind::object) s["default"] = f.default_value;
  if (f.kind == Kind::integer || f.kind == Kind::number) add_range(s, f.range);
  if (f.kind == Kind::integer_list) add_range(s["items"], f.range);
  if (!f.choices.empty()) s["enum"] = f.choices;
  if (!types.empty()) s["x-applies-to"] = f.applies_to.empty() ? types : f.applies_to;
  return s;
}

}  // namespace

std::string comma_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool applies(const Field& f, const std::string& type) {
  return f.applies_to.empty() || std::find(f.applies_to.begin(), f.applies_to.end(), type) != f.applies_to.end();
}

void fail(const std::string& path, const std::string& what) { throw ConfigError(path + ": " + what); }

std::string type_name(const json& v) {
  if (is_integer(v)) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return std::string("a ") + v.type_name();  // a string, a boolean
}

std::string described(const json& v) {
  if (v.is_null()) return "null";
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return type_name(v) + " " + text;
}

std::string join_path(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

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

Section::Section(const json& j, std::string path, const std::vector<Field>& fields)
    : j_(j), path_(std::move(path)), fields_(fields) {
  if (!j.is_object()) fail(path_.empty() ? "config" : path_, "expected an object, got " + type_name(j));
  for (const auto& [key, value] : j.items()) {
    const Field* f = find(key);
    if (f == nullptr) {
      std::vector<std::string> valid;
      for (const auto& g : fields) valid.emplace_back(g.key);
      const std::string guess = nearest(key, fields);
      fail(join_path(path_, key), "unknown key" + (guess.empty() ? "" : " (did you mean '" + guess + "'?)") +
                                      "; valid keys: " + comma_list(valid));
    }
    check(*f, value);
  }
}

json Section::get(const char* key) const { return has(key) ? at(key) : find(key)->default_value; }

const json& Section::object(const char* key) const {
  static const json empty = json::object();
  return has(key) ? at(key) : empty;
}

void Section::forbid(const char* key, const std::string& why) const {
  if (has(key)) fail(path(key), why);
}

void Section::require(const char* key, const std::string& when) const {
  if (!has(key)) fail(path(key), "required " + when);
}

const Field* Section::find(const std::string& key) const {
  for (const auto& f : fields_) {
    if (key == f.key) return &f;
  }
  return nullptr;
}

void Section::check(const Field& f, const json& v) const {
  const std::string p = join_path(path_, f.key);
  switch (f.kind) {
    case Kind::integer: check_integer(p, f, v); break;
    case Kind::number:
      if (!v.is_number()) fail(p, "expected a number, got " + described(v));
      check_range(p, f, v);
      break;
    case Kind::boolean:
      if (!v.is_boolean()) fail(p, "expected true or false, got " + described(v));
      break;
    case Kind::string: check_string(p, f, v); break;
    case Kind::number_pair:
      if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
        fail(p, "expected " + std::string(f.doc) + ", two numbers, got " + v.dump());
      }
      break;
    case Kind::integer_list: check_integer_list(p, f, v); break;
    case Kind::string_list: check_string_list(p, v); break;
    case Kind::object:
      if (!v.is_object()) fail(p, "expected an object, got " + type_name(v));
      break;
  }
}

json section_schema(const std::vector<Field>& fields, const char* type_field) {
  std::vector<std::string> types;
  for (const auto& f : fields) {
    if (type_field != nullptr && std::string(type_field) == f.key) types = f.choices;
  }
  json props = json::object();
  for (const auto& f : fields) props[f.key] = field_schema(f, types);
  return {{"type", "object"}, {"additionalProperties", false}, {"properties", props}};
}

}  // namespace scape::config
