// The rows of a run file's step table that a given step keeps, shared by the recorder (which
// drops the rest on --resume) and scape repair (which drops the rest of an interrupted flush).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "experiments/hdf5.hpp"

namespace scape::experiments {

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

}  // namespace scape::experiments
