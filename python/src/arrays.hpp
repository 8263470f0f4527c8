// Tensors across the binding: a DLPack array (a CPU torch tensor, a numpy array; a CUDA tensor
// where the build has CUDA) checked once, then seen as a span of its memory (zero-copy). A
// wrong dtype, device, stride or size raises ValueError naming the argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace scape::python {

namespace nb = nanobind;

// The memory of a 1-D float32 array of `expected` values (any length when expected is
// kAnySize). `argument` names it in the error.
inline constexpr std::size_t kAnySize = static_cast<std::size_t>(-1);
std::span<const float> float_span(const nb::ndarray<>& array, const std::string& argument,
                                  std::size_t expected = kAnySize);
// Row r of a 2-D float32 [rows, n] array, as spans.
std::span<const float> float_row(const nb::ndarray<>& array, std::size_t row, std::size_t n);
// Checks a 2-D float32 array of shape [rows, n] (C-contiguous).
void check_float_matrix(const nb::ndarray<>& array, const std::string& argument, std::size_t rows, std::size_t n);

// A numpy array that views `data` (no copy) and keeps `owner` alive while it exists.
nb::object float_view(std::span<const float> data, nb::handle owner);
nb::object word_view(std::span<const std::uint64_t> data, nb::handle owner);

}  // namespace scape::python
