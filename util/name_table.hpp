// Name tables: the names of an enum's values (or of a list of presets) written once, looked up
// both ways, and an unknown name reported with the names that would have been accepted. Header
// only and below every other folder, so kernels/, core/, sim/ and predict/ share it.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace scape {

// One row of an enum's name table.
template <typename Enum>
struct EnumName {
  const char* name;
  Enum value;
};

// The names of the rows (any struct with a `const char* name`), in table order.
template <typename Rows>
std::vector<std::string> names_of(const Rows& rows) {
  std::vector<std::string> names;
  for (const auto& row : rows) names.emplace_back(row.name);
  return names;
}

// The accepted names of the rows, as an error message says them: "a or b" for two,
// "one of a, b, c" otherwise.
template <typename Rows>
std::string expected_names(const Rows& rows) {
  const std::vector<std::string> names = names_of(rows);
  if (names.size() == 2) return names[0] + " or " + names[1];
  std::string list = "one of ";
  for (std::size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : ", ") + names[i];
  return list;
}

// The row named `name`; else throws std::invalid_argument
//   "<field>: unknown <what> '<name>' (expected <expected_names(rows)>)".
template <typename Rows>
const auto& find_by_name(const Rows& rows, std::string_view name, std::string_view field,
                         std::string_view what = "value") {
  for (const auto& row : rows) {
    if (name == row.name) return row;
  }
  throw std::invalid_argument(std::string(field) + ": unknown " + std::string(what) + " '" + std::string(name) +
                              "' (expected " + expected_names(rows) + ")");
}

// The name of `value` in an EnumName table; "unknown" for a value the table lacks.
template <typename Rows, typename Enum>
const char* name_of(const Rows& rows, Enum value) {
  for (const auto& row : rows) {
    if (row.value == value) return row.name;
  }
  return "unknown";
}

}  // namespace scape
