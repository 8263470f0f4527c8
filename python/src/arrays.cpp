// The checks of arrays.hpp and the numpy views the binding hands out.
#include "arrays.hpp"

#include <stdexcept>

namespace scape::python {
namespace {

const char* device_name(int type) {
  switch (type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_managed::value: return "cuda (managed)";
    default: return "another device";
  }
}

std::string dtype_name(const nb::dlpack::dtype& d) {
  const char* kind = d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float)  ? "float"
                     : d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)  ? "int"
                     : d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt) ? "uint"
                     : d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) ? "bfloat"
                                                                                            : "other";
  return std::string(kind) + std::to_string(d.bits);
}

void check_common(const nb::ndarray<>& a, const std::string& argument) {
  if (a.dtype() != nb::dtype<float>()) {
    throw nb::value_error((argument + ": dtype " + dtype_name(a.dtype()) + ", expected float32").c_str());
  }
  if (a.device_type() != nb::device::cpu::value) {
    throw nb::value_error((argument + ": on " + device_name(a.device_type()) +
                           "; this build's optimizer core reads host memory (a CPU tensor or a numpy array)")
                              .c_str());
  }
  // C order: the last stride is 1, each earlier one the product of the later extents.
  std::int64_t expected = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) > 1 && a.stride(d) != expected) {
      throw nb::value_error((argument + ": not contiguous (call .contiguous() or numpy.ascontiguousarray)").c_str());
    }
    expected *= static_cast<std::int64_t>(a.shape(d));
  }
}

}  // namespace

std::span<const float> float_span(const nb::ndarray<>& array, const std::string& argument, std::size_t expected) {
  check_common(array, argument);
  if (array.ndim() != 1) {
    throw nb::value_error((argument + ": " + std::to_string(array.ndim()) + " dimensions, expected a flat 1-D array")
                              .c_str());
  }
  if (expected != kAnySize && array.shape(0) != expected) {
    throw nb::value_error((argument + ": " + std::to_string(array.shape(0)) + " values, the layout has " +
                           std::to_string(expected))
                              .c_str());
  }
  return {static_cast<const float*>(array.data()), array.shape(0)};
}

void check_float_matrix(const nb::ndarray<>& array, const std::string& argument, std::size_t rows, std::size_t n) {
  check_common(array, argument);
  if (array.ndim() != 2 || array.shape(0) != rows || array.shape(1) != n) {
    std::string shape;
    for (std::size_t d = 0; d < array.ndim(); ++d) shape += (d ? ", " : "") + std::to_string(array.shape(d));
    throw nb::value_error((argument + ": shape [" + shape + "], expected [" + std::to_string(rows) + ", " +
                           std::to_string(n) + "] (workers, layout size)")
                              .c_str());
  }
}

std::span<const float> float_row(const nb::ndarray<>& array, std::size_t row, std::size_t n) {
  return {static_cast<const float*>(array.data()) + row * n, n};
}

nb::object float_view(std::span<const float> data, nb::handle owner) {
  static const float empty = 0;
  const std::size_t shape[1] = {data.size()};
  nb::ndarray<nb::numpy, const float, nb::ndim<1>> a(data.empty() ? &empty : data.data(), 1, shape, owner);
  return nb::cast(a, nb::rv_policy::reference);
}

nb::object word_view(std::span<const std::uint64_t> data, nb::handle owner) {
  static const std::uint64_t empty = 0;
  const std::size_t shape[1] = {data.size()};
  nb::ndarray<nb::numpy, const std::uint64_t, nb::ndim<1>> a(data.empty() ? &empty : data.data(), 1, shape, owner);
  return nb::cast(a, nb::rv_policy::reference);
}

}  // namespace scape::python
