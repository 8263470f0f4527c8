// GradientTrace: traces written through the plain HDF5 C API and by the package's scape.trace (python/scape/trace.py)
// read back exactly; malformed traces name the file and dataset; concurrent reads are correct.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "run_file/trace.hpp"
#include "test_support.hpp"

using namespace scape::run_file;
using namespace scape::testing;
namespace fs = std::filesystem;

namespace {

// ctest sets SCAPE_SOURCE_DIR; run by hand, the test finds the tree from its own source path.
fs::path source_dir() {
  if (const char* dir = std::getenv("SCAPE_SOURCE_DIR")) return dir;
  return fs::path(__FILE__).parent_path().parent_path();
}

int run_python(const TempDir& dir, const std::string& script) {
  const fs::path file = dir / "write_trace.py";
  std::ofstream(file) << script;
  return std::system(("cd '" + source_dir().string() + "' && /usr/bin/python3 '" + file.string() + "'").c_str());
}

// The trace every test writes: values exact in float32.
const std::vector<std::string> kNames = {"wte", "h0.attn.w", "h0.attn.b", "ln_f.b"};
const std::vector<std::int64_t> kSizes = {40, 24, 6, 3};
const std::vector<std::uint8_t> kDecay = {1, 1, 0, 0};
constexpr std::size_t kN = 73;
constexpr int kSteps = 6, kWorkers = 4;

float init_value(std::size_t j) { return static_cast<float>(j) * 0.5f - 3.0f; }
float grad_value(int step, int worker, std::size_t j) {
  return static_cast<float>(step * 1000 + worker * 100) + static_cast<float>(j) * 0.25f;
}

// What to break in a C-API trace.
struct Defects {
  bool no_init = false;
  bool grads_2d = false;
  std::size_t grads_n = kN;
  std::size_t sizes_count = 4;
};

// Writes the trace with the plain C API (fixed-length names, unlike h5py's variable-length).
void write_c_trace(const fs::path& path, const Defects& defects = {}) {
  const auto lock = lock_hdf5();
  const hid_t file = H5Fcreate(path.string().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  const auto write = [&](const char* name, hid_t file_type, hid_t mem_type, std::vector<hsize_t> dims,
                         const void* data, hid_t dcpl = H5P_DEFAULT) {
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t d = H5Dcreate2(file, name, file_type, space, lcpl, dcpl, H5P_DEFAULT);
    REQUIRE(d >= 0);
    REQUIRE(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(d);
    H5Sclose(space);
  };

  const hid_t name_type = H5Tcopy(H5T_C_S1);
  H5Tset_size(name_type, 16);
  std::vector<char> names(16 * kNames.size(), '\0');
  for (std::size_t i = 0; i < kNames.size(); ++i) kNames[i].copy(names.data() + 16 * i, 15);
  write("layout/names", name_type, name_type, {kNames.size()}, names.data());
  H5Tclose(name_type);
  write("layout/sizes", H5T_STD_I64LE, H5T_NATIVE_INT64, {defects.sizes_count}, kSizes.data());
  write("layout/decay", H5T_STD_U8LE, H5T_NATIVE_UINT8, {kDecay.size()}, kDecay.data());
  std::vector<float> init(kN);
  for (std::size_t j = 0; j < kN; ++j) init[j] = init_value(j);
  if (!defects.no_init) write("init/params", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {kN}, init.data());

  const std::size_t n = defects.grads_n;
  std::vector<float> grads;
  for (int t = 1; t <= kSteps; ++t)
    for (int w = 0; w < kWorkers; ++w)
      for (std::size_t j = 0; j < n; ++j) grads.push_back(grad_value(t, w, j));
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (defects.grads_2d) {
    write("grads", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {kSteps * kWorkers, n}, grads.data());
  } else {
    const hsize_t chunk[3] = {1, kWorkers, n};
    H5Pset_chunk(dcpl, 3, chunk);
    write("grads", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {kSteps, kWorkers, n}, grads.data(), dcpl);
  }
  H5Pclose(dcpl);
  H5Pclose(lcpl);
  REQUIRE(H5Fclose(file) >= 0);
}

// The Python equivalent, through scape.trace's TraceWriter.
std::string python_trace_script(const fs::path& path) {
  return R"(
import sys
sys.path.insert(0, "python")
import numpy as np
from scape.trace import TraceWriter
names = ["wte", "h0.attn.w", "h0.attn.b", "ln_f.b"]
sizes = [40, 24, 6, 3]
n = sum(sizes)
init = np.arange(n, dtype=np.float32) * 0.5 - 3.0
with TraceWriter(")" + path.string() + R"(", names, sizes, [True, True, False, False], init, workers=4) as trace:
    for t in range(1, 7):
        trace.append((t * 1000 + np.arange(4)[:, None] * 100 + np.arange(n)[None, :] * 0.25).astype(np.float32))
)";
}

void check_trace(const GradientTrace& trace) {
  CHECK(trace.names() == kNames);
  REQUIRE(trace.sizes().size() == kSizes.size());
  for (std::size_t i = 0; i < kSizes.size(); ++i) CHECK(trace.sizes()[i] == static_cast<std::size_t>(kSizes[i]));
  CHECK(trace.decay() == std::vector<bool>{true, true, false, false});
  CHECK(trace.steps() == kSteps);
  CHECK(trace.workers() == kWorkers);
  REQUIRE(trace.size() == kN);

  std::vector<float> buffer(kN);
  trace.read_init(buffer);
  for (std::size_t j = 0; j < kN; ++j) CHECK(buffer[j] == init_value(j));
  for (int t = 1; t <= kSteps; ++t) {
    for (int w = 0; w < kWorkers; ++w) {
      trace.read_grad(t, w, buffer);
      for (std::size_t j = 0; j < kN; ++j) {
        CAPTURE(t);
        CAPTURE(w);
        CAPTURE(j);
        CHECK(buffer[j] == grad_value(t, w, j));
      }
    }
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a trace written through the C API reads back exactly") {
  TempDir dir;
  write_c_trace(dir / "trace.h5");
  check_trace(GradientTrace(dir / "trace.h5"));
}

TEST_CASE("a trace written by the package's scape.trace (python/scape/trace.py) reads back exactly") {
  if (skip_without_h5py()) return;
  TempDir dir;
  REQUIRE(run_python(dir, python_trace_script(dir / "trace.h5")) == 0);
  check_trace(GradientTrace(dir / "trace.h5"));
}

TEST_CASE("the scape.trace demo writes a trace the reader accepts") {
  if (skip_without_h5py()) return;
  TempDir dir;
  const fs::path out = dir / "demo.h5";
  const std::string command = "cd '" + source_dir().string() +
                              "' && PYTHONPATH=python /usr/bin/python3 -m scape.trace --demo '" + out.string() +
                              "' --steps 3 --workers 2 >/dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  const GradientTrace trace(out);
  CHECK(trace.steps() == 3);
  CHECK(trace.workers() == 2);
  CHECK(trace.names().size() == 3);
  std::size_t total = 0;
  for (std::size_t s : trace.sizes()) total += s;
  CHECK(trace.size() == total);
}

TEST_CASE("malformed traces name the file and the dataset") {
  TempDir dir;
  const auto error_for = [&](const std::string& name, const Defects& defects) {
    const fs::path path = dir / name;
    write_c_trace(path, defects);
    const std::string error = error_of([&] { GradientTrace trace(path); });
    CHECK(contains(error, path.string()));
    return error;
  };
  CHECK(contains(error_for("no_init.h5", {.no_init = true}), "missing dataset '/init/params'"));
  CHECK(contains(error_for("flat_grads.h5", {.grads_2d = true}), "'/grads'"));
  const std::string wrong_n = error_for("wrong_n.h5", {.grads_n = kN - 1});
  CHECK(contains(wrong_n, "'/grads'"));
  CHECK(contains(wrong_n, "[6, 4, 72]"));
  CHECK(contains(error_for("short_sizes.h5", {.sizes_count = 3}), "'/layout/sizes'"));

  const fs::path missing = dir / "missing.h5";
  CHECK(contains(error_of([&] { GradientTrace trace(missing); }), missing.string()));
  const fs::path text = dir / "text.h5";
  std::ofstream(text) << "plain text";
  const std::string not_hdf5 = error_of([&] { GradientTrace trace(text); });
  CHECK(contains(not_hdf5, text.string()));
  CHECK(contains(not_hdf5, "not an HDF5 file"));
  CHECK_THROWS_AS(GradientTrace{text}, H5Error);
}

TEST_CASE("read_grad checks its step, worker and buffer") {
  TempDir dir;
  write_c_trace(dir / "trace.h5");
  const GradientTrace trace(dir / "trace.h5");
  std::vector<float> buffer(kN);
  CHECK_THROWS_AS(trace.read_grad(0, 0, buffer), std::out_of_range);
  CHECK_THROWS_AS(trace.read_grad(kSteps + 1, 0, buffer), std::out_of_range);
  CHECK_THROWS_AS(trace.read_grad(1, kWorkers, buffer), std::out_of_range);
  CHECK_THROWS_AS(trace.read_grad(1, -1, buffer), std::out_of_range);
  std::vector<float> short_buffer(kN - 1);
  CHECK_THROWS_AS(trace.read_grad(1, 0, short_buffer), std::invalid_argument);
  CHECK_THROWS_AS(trace.read_init(short_buffer), std::invalid_argument);
}

TEST_CASE("read_grad waits for the process-wide HDF5 lock") {
  TempDir dir;
  write_c_trace(dir / "trace.h5");
  const GradientTrace trace(dir / "trace.h5");
  std::atomic<bool> done{false};
  std::thread reader;
  {
    const auto lock = lock_hdf5();
    reader = std::thread([&] {
      std::vector<float> buffer(kN);
      trace.read_grad(1, 0, buffer);
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(done.load());
  }
  reader.join();
  CHECK(done.load());
}

TEST_CASE("concurrent reads from 4 threads give the right values while a run file is written") {
  TempDir dir;
  write_c_trace(dir / "trace.h5");
  const GradientTrace trace(dir / "trace.h5");
  std::atomic<long> wrong{0}, reads{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      std::vector<float> buffer(kN);
      for (int round = 0; round < 50; ++round) {
        for (int t = 1; t <= kSteps; ++t) {
          // Each thread reads its own worker's slice, then a neighbour's, as replay ranks would.
          for (int which : {w, (w + round) % kWorkers}) {
            trace.read_grad(t, which, buffer);
            for (std::size_t j = 0; j < kN; ++j) wrong += buffer[j] != grad_value(t, which, j);
            ++reads;
          }
        }
      }
    });
  }
  // HDF5 calls of the recorder share the same process-wide lock.
  RunFileSpec spec;
  spec.metric_names = {"loss"};
  spec.flush_interval = 2;
  {
    RunRecorder recorder = RunRecorder::create(dir / "run.h5", spec);
    for (long step = 1; step <= 200; ++step) {
      const double loss = 1.0 / static_cast<double>(step);
      recorder.append_step(step, std::span<const double>(&loss, 1));
    }
  }
  for (std::thread& t : workers) t.join();
  CHECK(wrong == 0);
  CHECK(reads == kWorkers * 50 * kSteps * 2);
  CHECK(read_run_summary(dir / "run.h5").steps_completed == 200);
}
