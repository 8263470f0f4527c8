// FNV-1a, 64 bits: the one byte hash behind run ids and checkpoint checksums. Header only and
// below every other folder. Not cryptographic: it detects corruption, not tampering.
#pragma once

#include <cstdint>
#include <string_view>

namespace scape {

// FNV's offset basis. Run ids start from kRunIdOffset instead, a digit short of it: kept, since
// run ids name the files of existing sweeps.
inline constexpr std::uint64_t kFnv1aOffset = 14695981039346656037ull;
inline constexpr std::uint64_t kRunIdOffset = 1469598103934665603ull;

// `h` continues an earlier call over the bytes before these (start: kFnv1aOffset).
inline std::uint64_t fnv1a_64(std::string_view bytes, std::uint64_t h = kFnv1aOffset) {
  for (unsigned char ch : bytes) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace scape
