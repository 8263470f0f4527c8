// Shared by the fuzz targets: a scratch folder per process, files written there from fuzz
// input, the repository's configs as bases, and the one rule of every target: an input may be
// refused only with the error type its reader documents; anything else (another exception, a
// crash, a sanitizer report) is a bug libFuzzer reports.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace scape::fuzz {

// Memory-backed (/dev/shm) where the system has it: the HDF5 targets write a file per input,
// and a disk-backed temporary folder made that, not the code under test, the cost of a run.
inline std::filesystem::path scratch_root() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
  return std::filesystem::temp_directory_path();
}

inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const auto p = scratch_root() / ("scape-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_root() / ("scape-fuzz-" + std::to_string(::getpid())), ec);
    });
    return p;
  }();
  return dir;
}

inline std::filesystem::path write_scratch(const std::string& name, std::string_view bytes) {
  const auto path = scratch() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A config of the repository (SCAPE_SOURCE_DIR/experiments/configs/...), as JSON.
inline nlohmann::json repository_config(const std::string& relative) {
  return nlohmann::json::parse(read_bytes(std::filesystem::path(SCAPE_SOURCE_DIR) / "experiments/configs" / relative));
}

// Stops the fuzzer with a message: a broken invariant, reported like a crash.
[[noreturn]] inline void invariant_broken(const char* what) {
  std::fprintf(stderr, "scape fuzz: invariant broken: %s\n", what);
  std::abort();
}

// The shared property of config parsers: JSON may be refused only with a ConfigError (`Error`),
// and an accepted config's resolved form (what a run or prediction records) parses to itself.
template <typename Error, typename Resolve>
void check_config_parser(const std::uint8_t* data, std::size_t size, Resolve&& resolve) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return;
  nlohmann::json resolved;
  try {
    resolved = resolve(j);
  } catch (const Error&) {
    return;
  }
  // Outside the try: a resolved config that does not parse is a bug, not a refusal.
  if (resolve(resolved) != resolved) invariant_broken("the resolved config does not parse to itself");
}

}  // namespace scape::fuzz
