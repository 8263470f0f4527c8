// Reader of recorded gradient traces, which let the simulator replay real per-worker gradients.
//
// Trace file format (HDF5; written by the package's scape.trace or any HDF5 writer):
//   /layout/names  strings [L]       tensor names, in flat-parameter order
//   /layout/sizes  int64 [L]         elements per tensor; they sum to N
//   /layout/decay  uint8 [L]         1 where the tensor takes weight decay
//   /init/params   float32 [N]       the flat parameters the gradients were taken from (step 0)
//   /grads         float32 [T, W, N] gradient of worker w at step t (1-based t stored at row
//                                    t - 1), step-major, chunked one step per chunk [1, W, N]
// Integer and float datasets of other widths are converted on read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "run_file/hdf5.hpp"

namespace scape::run_file {

class GradientTrace {
 public:
  // Opens and validates the trace; H5Error names the file and the missing or mismatched
  // dataset (sizes not summing to N, /grads not [T, W, N], ...).
  explicit GradientTrace(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<std::size_t>& sizes() const { return sizes_; }
  const std::vector<bool>& decay() const { return decay_; }
  int steps() const { return steps_; }
  int workers() const { return workers_; }
  std::size_t size() const { return size_; }

  // out.size() must be size().
  void read_init(std::span<float> out) const;
  // step is 1-based, worker 0-based; out.size() must be size(). Safe to call from many threads
  // at once: the reads are serialized by hdf5_mutex().
  void read_grad(int step, int worker, std::span<float> out) const;

 private:
  std::filesystem::path path_;
  File file_;  // declared first, so it closes after the datasets
  Dataset init_, grads_;
  std::vector<std::string> names_;
  std::vector<std::size_t> sizes_;
  std::vector<bool> decay_;
  int steps_ = 0, workers_ = 0;
  std::size_t size_ = 0;
};

}  // namespace scape::run_file
