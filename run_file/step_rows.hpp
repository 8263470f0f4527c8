// The rows of a run file's step table that a given step keeps, shared by the recorder (which
// drops the rest on --resume) and scape repair (which drops the rest of an interrupted flush).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "run_file/hdf5.hpp"

namespace scape::run_file {

// The steps of a step table. Every row of one is written, so a table claiming more rows than
// the file has bytes for is corrupt: refused before its rows are allocated.
inline std::vector<std::int64_t> read_steps(const Dataset& table) {
  const std::vector<hsize_t> dims = table.dims();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(table.file_path(), ec);
  if (dims.size() != 1 || (!ec && dims[0] > bytes / sizeof(std::int64_t)))
    throw_invalid_file(table.file_path(), in_quotes(table.name()) + " is not a 1-D table of the file's steps");
  return table.read_all<std::int64_t>();
}

// Number of leading rows with step <= limit; throws H5Error naming `table` when the steps do
// not increase.
inline hsize_t rows_up_to(const std::vector<std::int64_t>& steps, long limit, const Dataset& table) {
  hsize_t rows = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (i > 0 && steps[i] <= steps[i - 1])
      throw_invalid_file(table.file_path(), in_quotes(table.name()) + " does not increase at row " + std::to_string(i));
    if (steps[i] <= limit) rows = i + 1;
  }
  return rows;
}

}  // namespace scape::run_file
