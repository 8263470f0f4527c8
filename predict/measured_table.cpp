// Measured step-time and peak-memory tables in CSV (predict/measured_table.hpp).
#include "predict/measured_table.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "config/json_section.hpp"

namespace scape::predict {
namespace {

using config::ConfigError;

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  for (auto& c : cells) {
    const auto first = c.find_first_not_of(" \t\r");
    const auto last = c.find_last_not_of(" \t\r");
    c = first == std::string::npos ? "" : c.substr(first, last - first + 1);
  }
  return cells;
}

template <std::size_t N>
bool one_of(const std::string& v, const std::string_view (&names)[N]) {
  return std::find(std::begin(names), std::end(names), v) != std::end(names);
}

template <std::size_t N>
std::string listed(const std::string_view (&names)[N]) {
  std::string out;
  for (const auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

struct Cursor {
  const std::filesystem::path& file;
  int line;
  [[noreturn]] void fail(const std::string& column, const std::string& what) const {
    throw ConfigError(file.string() + ": row " + std::to_string(line) + ", column " + column + ": " + what);
  }
};

double positive_number(const Cursor& at, const std::string& column, const std::string& cell) {
  if (cell.empty()) at.fail(column, "missing value");
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(cell, &used);
  } catch (const std::exception&) {
    at.fail(column, "'" + cell + "' is not a number");
  }
  if (used != cell.size()) at.fail(column, "'" + cell + "' is not a number");
  if (!std::isfinite(v)) at.fail(column, "'" + cell + "' is not finite");
  if (v <= 0) at.fail(column, cell + " must be > 0");
  return v;
}

int positive_integer(const Cursor& at, const std::string& column, const std::string& cell) {
  const double v = positive_number(at, column, cell);
  if (v != std::floor(v) || v > 1e6) at.fail(column, "'" + cell + "' is not a whole number of GPUs");
  return static_cast<int>(v);
}

}  // namespace

MeasuredTable read_measured_table(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot open the measured table");
  MeasuredTable t;
  t.file = file;
  std::string line;
  if (!std::getline(in, line)) throw ConfigError(file.string() + ": empty file (no header)");
  const auto header = split_csv(line);
  const std::vector<std::string> steps{"model", "method", "gpus", "step_ms"}, memory{"model", "method", "peak_MB"};
  if (header == memory) {
    t.memory = true;
  } else if (header != steps) {
    throw ConfigError(file.string() +
                      ": row 1: the header must be 'model,method,gpus,step_ms' or "
                      "'model,method,peak_MB'");
  }
  const std::vector<std::string>& columns = t.memory ? memory : steps;
  for (int number = 2; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line
    const Cursor at{file, number};
    auto cells = split_csv(line);
    if (cells.size() > columns.size())
      at.fail(columns.back(), "more cells than the header's " + std::to_string(columns.size()));
    cells.resize(columns.size());
    MeasuredRow r;
    r.line = number;
    r.model = cells[0];
    r.method = cells[1];
    if (r.model.empty()) at.fail("model", "missing value");
    if (!one_of(r.model, kTableModels))
      at.fail("model", "unknown model '" + r.model + "' (" + listed(kTableModels) + ")");
    if (r.method.empty()) at.fail("method", "missing value");
    const bool known = t.memory ? one_of(r.method, kMemoryMethods) : one_of(r.method, kStepMethods);
    if (!known) {
      at.fail("method",
              "unknown method '" + r.method + "' (" + (t.memory ? listed(kMemoryMethods) : listed(kStepMethods)) + ")");
    }
    if (!t.memory) r.gpus = positive_integer(at, "gpus", cells[2]);
    r.value = positive_number(at, columns.back(), cells.back());
    for (const auto& earlier : t.rows) {
      if (earlier.model == r.model && earlier.method == r.method && earlier.gpus == r.gpus) {
        at.fail("method", "repeats row " + std::to_string(earlier.line));
      }
    }
    t.rows.push_back(r);
  }
  if (t.rows.empty()) throw ConfigError(file.string() + ": no rows below the header");
  return t;
}

}  // namespace scape::predict
