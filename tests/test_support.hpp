// Helpers shared by the test programs: a temporary directory removed with its contents, a
// shell command run with its exit status, output and duration, a file's bytes, the SCAPE run the
// end-to-end tests kill and resume, the message a call throws, and the h5py check.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace scape::testing {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("scape-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }

  std::filesystem::path path;
};

struct CommandResult {
  int code = 0;         // exit status; 128 when the command did not exit normally
  std::string output;   // stdout and stderr together
  double seconds = 0;
};

inline CommandResult run_command(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed for: " + command);
  CommandResult r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.output += buf;
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

inline void write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// Every byte of a file (run files, checkpoints, logs), for comparisons byte for byte.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The end-to-end tests' run to kill, interrupt and resume: SCAPE on the noisy quadratic at W = 2,
// `steps` long; a flush every 5 steps and no oracle make its steps fast and its file current.
inline std::string quadratic_scape_config(long steps) {
  return R"({"name": "quad", "seed": 3, "workers": 2, "steps": )" + std::to_string(steps) + R"(,
  "model": {"type": "quadratic", "size": 2000},
  "optimizer": {"type": "scape", "sparsity": 0.99, "lr": 0.01},
  "log": {"flush_interval": 5, "oracle": false}
})";
}

#ifdef SCAPE_BINARY
// `scape ARGS` of this build (the end-to-end tests define SCAPE_BINARY).
inline CommandResult run_scape(const std::string& args) { return run_command(std::string(SCAPE_BINARY) + " " + args); }
#endif

// What f throws, as its message; empty when it throws nothing.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

inline bool have_h5py() {
  return std::filesystem::exists("/usr/bin/python3") &&
         std::system("/usr/bin/python3 -c 'import h5py, numpy' >/dev/null 2>&1") == 0;
}

// A test that needs h5py returns at once where it is missing, saying so rather than failing.
inline bool skip_without_h5py() {
  if (have_h5py()) return false;
  MESSAGE("skipping: /usr/bin/python3 with h5py and numpy not found");
  return true;
}

}  // namespace scape::testing
