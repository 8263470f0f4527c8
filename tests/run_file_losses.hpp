// Comparing the losses of two run files (the GPU training tests: a run against its CPU or
// simulator twin). Include after doctest.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "run_file/hdf5.hpp"

namespace scape::testing {

inline std::vector<double> read_series(const std::filesystem::path& file, const std::string& dataset) {
  return scape::run_file::File::open(file, scape::run_file::Access::read).open_dataset(dataset).read_all<double>();
}

// Checks every training and validation loss of `got` within `relative` of `want`'s; returns
// whether any of them differs at all.
inline bool losses_within(const std::filesystem::path& got_file, const std::filesystem::path& want_file,
                          double relative) {
  bool differs = false;
  for (const char* dataset : {"/metrics/train_loss", "/eval/val_loss"}) {
    CAPTURE(dataset);
    const auto want = read_series(want_file, dataset), got = read_series(got_file, dataset);
    REQUIRE(got.size() == want.size());
    REQUIRE(!want.empty());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(got[i] - want[i]) <= relative * std::abs(want[i]));
      differs = differs || got[i] != want[i];
    }
  }
  return differs;
}

}  // namespace scape::testing
