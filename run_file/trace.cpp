// GradientTrace: opening and validating a gradient trace, and its hyperslab reads.
#include "run_file/trace.hpp"

#include <limits>
#include <numeric>
#include <stdexcept>

namespace scape::run_file {

namespace {

// More tensors than any model has: a larger '/layout/names' is a corrupt extent.
constexpr std::size_t kMaxTensors = std::size_t{1} << 20;

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string s;
  for (hsize_t d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

// Opens `path` and checks it is a `rank`-D dataset of the given type class.
Dataset open_checked(const File& file, const std::string& path, std::size_t rank, H5T_class_t cls) {
  Dataset dataset = file.open_dataset(path);
  const std::vector<hsize_t> dims = dataset.dims();
  if (dims.size() != rank)
    throw_invalid_file(file.file_path(), "dataset " + in_quotes(dataset.name()) + " must be " + std::to_string(rank) +
                                             "-D, found dims " + dims_text(dims));
  if (dataset.type_class() != cls)
    throw_invalid_file(file.file_path(), "dataset " + in_quotes(dataset.name()) + " must hold " +
                                             (cls == H5T_FLOAT ? "floats" : "integers"));
  return dataset;
}

void check_length(const File& file, const Dataset& dataset, std::size_t expected, const std::string& reason) {
  const hsize_t found = dataset.dims().at(0);
  if (found != expected)
    throw_invalid_file(file.file_path(), "dataset " + in_quotes(dataset.name()) + " has " + std::to_string(found) +
                                             " entries, expected " + std::to_string(expected) + " (" + reason + ")");
}

}  // namespace

GradientTrace::GradientTrace(const std::filesystem::path& path) : path_(path) {
  const auto lock = lock_hdf5();
  file_ = File::open(path, Access::read);

  names_ = file_.open_dataset("layout/names").read_strings(kMaxTensors);
  const Dataset sizes = open_checked(file_, "layout/sizes", 1, H5T_INTEGER);
  const Dataset decay = open_checked(file_, "layout/decay", 1, H5T_INTEGER);
  check_length(file_, sizes, names_.size(), "one per name in '/layout/names'");
  check_length(file_, decay, names_.size(), "one per name in '/layout/names'");
  for (std::int64_t s : sizes.read_all<std::int64_t>()) {
    if (s < 0) throw_invalid_file(path_.string(), "dataset '/layout/sizes' holds a negative size");
    sizes_.push_back(static_cast<std::size_t>(s));
  }
  for (std::uint8_t d : decay.read_all<std::uint8_t>()) decay_.push_back(d != 0);
  size_ = std::accumulate(sizes_.begin(), sizes_.end(), std::size_t{0});

  init_ = open_checked(file_, "init/params", 1, H5T_FLOAT);
  check_length(file_, init_, size_, "N, the sum of '/layout/sizes'");

  grads_ = open_checked(file_, "grads", 3, H5T_FLOAT);
  const std::vector<hsize_t> dims = grads_.dims();
  if (dims[2] != size_ || dims[1] == 0)
    throw_invalid_file(path_.string(), "dataset '/grads' has dims " + dims_text(dims) + ", expected [T, W >= 1, " +
                                           std::to_string(size_) + "] (N, the sum of '/layout/sizes')");
  constexpr hsize_t kIntMax = std::numeric_limits<int>::max();
  if (dims[0] > kIntMax || dims[1] > kIntMax)
    throw_invalid_file(path_.string(), "dataset '/grads' has more steps or workers than an int holds");
  steps_ = static_cast<int>(dims[0]);
  workers_ = static_cast<int>(dims[1]);
}

void GradientTrace::read_init(std::span<float> out) const {
  if (out.size() != size_)
    throw std::invalid_argument("gradient trace " + in_quotes(path_.string()) + ": read_init needs " +
                                std::to_string(size_) + " values, got " + std::to_string(out.size()));
  init_.read<float>({0}, {size_}, out);
}

void GradientTrace::read_grad(int step, int worker, std::span<float> out) const {
  if (step < 1 || step > steps_ || worker < 0 || worker >= workers_)
    throw std::out_of_range("gradient trace " + in_quotes(path_.string()) + ": no gradient for step " +
                            std::to_string(step) + " (1.." + std::to_string(steps_) + "), worker " +
                            std::to_string(worker) + " (0.." + std::to_string(workers_ - 1) + ")");
  if (out.size() != size_)
    throw std::invalid_argument("gradient trace " + in_quotes(path_.string()) + ": read_grad needs " +
                                std::to_string(size_) + " values, got " + std::to_string(out.size()));
  // One step's gradient of one worker is a contiguous slice of the [1, W, N] chunk.
  grads_.read<float>({static_cast<hsize_t>(step - 1), static_cast<hsize_t>(worker), 0}, {1, 1, size_}, out);
}

}  // namespace scape::run_file
