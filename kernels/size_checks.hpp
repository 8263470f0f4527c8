// Size checks shared by the CPU and CUDA kernels, so a bad call throws the same
// std::invalid_argument, with the same message, on either device (before any launch).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace scape::kernels::checks {

// Two dense buffers of one elementwise kernel.
inline void require_same(std::size_t a, std::size_t b, const char* what) {
  if (a != b) {
    throw std::invalid_argument(std::string(what) + ": buffer sizes differ (" + std::to_string(a) + " vs " +
                                std::to_string(b) + ")");
  }
}

// An index list and the compacted values it gathers or scatters.
inline void require_compacted(std::size_t indices, std::size_t values, const char* what) {
  if (indices != values) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(indices) + " indices but " +
                                std::to_string(values) + " compacted values");
  }
}

// A buffer that must hold exactly `want` entries.
inline void require_size(std::size_t got, std::size_t want, const char* what) {
  if (got != want) {
    throw std::invalid_argument(std::string(what) + ": buffer holds " + std::to_string(got) + " entries, expected " +
                                std::to_string(want));
  }
}

// A bitmask of `have` 64-bit words that must cover `bits` bits.
inline void require_words(std::size_t have, std::size_t bits, const char* what) {
  const std::size_t need = (bits + 63) / 64;
  if (have != need) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(have) + " words given, " +
                                std::to_string(bits) + " bits need " + std::to_string(need));
  }
}

// Two bitmasks combined word by word.
inline void require_same_words(std::size_t a, std::size_t b, const char* what) {
  if (a != b) {
    throw std::invalid_argument(std::string(what) + ": masks differ in length (" + std::to_string(a) + " vs " +
                                std::to_string(b) + " words)");
  }
}

}  // namespace scape::kernels::checks
