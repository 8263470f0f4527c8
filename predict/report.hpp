// Output of a prediction: the printed table, the HDF5 prediction file and a CSV copy of the
// table (docs/PREDICTING.md, "Outputs", gives the file layout).
#pragma once

#include <filesystem>
#include <ostream>

#include "predict/prediction.hpp"

namespace scape::predict {

// The resolved inputs, one per line: model, GPU, network, batch, overlap, optimizer, baseline.
void print_header(std::ostream& out, const Prediction& p);
// The header lines and one markdown table: a row per worker count and configuration.
void print_prediction(std::ostream& out, const Prediction& p);
// Throws run_file::H5Error when the file cannot be written.
void write_prediction_hdf5(const std::filesystem::path& path, const Prediction& p);
// Throws std::runtime_error naming the file when it cannot be written.
void write_prediction_csv(const std::filesystem::path& path, const Prediction& p);

}  // namespace scape::predict
