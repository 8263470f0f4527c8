// RunRecorder and read_run_summary: exact round trip through the plain HDF5 C API (and h5py
// when /usr/bin/python3 has it), flush intervals, status and errors, a SIGKILLed writer, and
// resuming a run file.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "test_support.hpp"

using namespace scape::run_file;
using namespace scape::testing;
namespace fs = std::filesystem;

namespace {

// How a check opens the run file: plainly once it is closed, as a SWMR reader while a writer
// may still hold it.
enum class H5pyOpen { plain, swmr };

// Runs a Python check of the run file at path (written next to the data): h5py opens the file
// as f, with numpy as np and sys imported, then check runs; returns the script's exit status.
int h5py_check(const TempDir& dir, const fs::path& path, H5pyOpen open, const std::string& check) {
  const std::string mode = open == H5pyOpen::swmr ? R"("r", swmr=True)" : R"("r")";
  const fs::path file = dir / "check.py";
  std::ofstream(file) << "import h5py, numpy as np, sys\nf = h5py.File(\"" << path.string() << "\", " << mode << ")\n"
                      << check;
  return std::system(("/usr/bin/python3 '" + file.string() + "'").c_str());
}

RunFileSpec test_spec(int flush_interval) {
  RunFileSpec spec;
  spec.config_json = R"({"optimizer": "scape", "steps": 11, "note": "d\u00e9j\u00e0 vu"})";
  spec.scape_version = "0.1.0";
  spec.git_sha = "0123456789abcdef";
  spec.metric_names = {"loss", "lr", "mask_jaccard"};
  spec.tensor_names = {"wte", "h0.attn.w", "h0.attn.b"};
  spec.tensor_metric_names = {"residual_norm", "mask_density"};
  spec.flush_interval = flush_interval;
  return spec;
}

// Known values: mask_jaccard is NaN on odd steps; `offset` tells resumed rows apart.
double metric_value(long step, std::size_t m, double offset = 0) {
  if (m == 2 && step % 2 == 1) return std::numeric_limits<double>::quiet_NaN();
  return offset + static_cast<double>(step) * 10.0 + static_cast<double>(m) + 0.125;
}
double tensor_value(long step, std::size_t k, std::size_t t, double offset = 0) {
  return offset + static_cast<double>(step) + static_cast<double>(k) * 0.5 + static_cast<double>(t) / 16.0;
}

void append(RunRecorder& recorder, const RunFileSpec& spec, long step, double offset = 0) {
  std::vector<double> metrics, tensors;
  for (std::size_t m = 0; m < spec.metric_names.size(); ++m) metrics.push_back(metric_value(step, m, offset));
  for (std::size_t k = 0; k < spec.tensor_metric_names.size(); ++k)
    for (std::size_t t = 0; t < spec.tensor_names.size(); ++t) tensors.push_back(tensor_value(step, k, t, offset));
  recorder.append_step(step, metrics, tensors);
}

// A recorder on a new run file at path that has appended steps 1..last.
RunRecorder create_with_steps(const fs::path& path, const RunFileSpec& spec, long last) {
  RunRecorder recorder = RunRecorder::create(path, spec);
  for (long step = 1; step <= last; ++step) append(recorder, spec, step);
  return recorder;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// ---- independent reader on the plain C API --------------------------------------------------

class RawFile {
 public:
  // A run file whose writer is live or was killed refuses plain readers; SWMR-read opens it.
  explicit RawFile(const fs::path& path, bool allow_swmr_read = true) {
    const auto lock = lock_hdf5();
    id_ = H5Fopen(path.string().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id_ < 0 && allow_swmr_read) id_ = H5Fopen(path.string().c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
  }
  ~RawFile() {
    const auto lock = lock_hdf5();
    if (id_ >= 0) H5Fclose(id_);
  }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  bool ok() const { return id_ >= 0; }

  std::vector<hsize_t> dims(const char* name) const {
    const auto lock = lock_hdf5();
    const hid_t d = H5Dopen2(id_, name, H5P_DEFAULT);
    REQUIRE_MESSAGE(d >= 0, name);
    const hid_t s = H5Dget_space(d);
    std::vector<hsize_t> out(static_cast<std::size_t>(H5Sget_simple_extent_ndims(s)));
    H5Sget_simple_extent_dims(s, out.data(), nullptr);
    H5Sclose(s);
    H5Dclose(d);
    return out;
  }
  template <typename T>
  std::vector<T> read(const char* name, hid_t mem_type) const {
    const auto lock = lock_hdf5();
    std::size_t n = 1;
    for (hsize_t d : dims(name)) n *= d;
    std::vector<T> out(n);
    const hid_t d = H5Dopen2(id_, name, H5P_DEFAULT);
    REQUIRE(H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
    H5Dclose(d);
    return out;
  }
  std::string string_attr(const char* name) const {
    const auto lock = lock_hdf5();
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    char* value = nullptr;
    read_attr(name, type, &value);
    std::string out(value);
    H5free_memory(value);
    H5Tclose(type);
    return out;
  }
  std::int64_t int_attr(const char* name) const {
    const auto lock = lock_hdf5();  // H5T_NATIVE_INT64 initialises the library on first use
    std::int64_t value = 0;
    read_attr(name, H5T_NATIVE_INT64, &value);
    return value;
  }

 private:
  void read_attr(const char* name, hid_t mem_type, void* value) const {
    const auto lock = lock_hdf5();
    const hid_t a = H5Aopen(id_, name, H5P_DEFAULT);
    REQUIRE_MESSAGE(a >= 0, name);
    REQUIRE(H5Aread(a, mem_type, value) >= 0);
    H5Aclose(a);
  }

  hid_t id_ = -1;
};

// Checks rows 0..steps.size()-1: steps, every metric and every tensor metric.
void check_rows(const RawFile& file, const RunFileSpec& spec, const std::vector<long>& steps,
                const std::vector<double>& offsets) {
  const auto stored_steps = file.read<std::int64_t>("/metrics/step", H5T_NATIVE_INT64);
  REQUIRE(stored_steps.size() == steps.size());
  for (std::size_t r = 0; r < steps.size(); ++r) CHECK(stored_steps[r] == steps[r]);
  for (std::size_t m = 0; m < spec.metric_names.size(); ++m) {
    const std::string name = "/metrics/" + spec.metric_names[m];
    const auto values = file.read<double>(name.c_str(), H5T_NATIVE_DOUBLE);
    REQUIRE(values.size() == steps.size());
    for (std::size_t r = 0; r < steps.size(); ++r) {
      CAPTURE(name);
      CAPTURE(r);
      CHECK(same(values[r], metric_value(steps[r], m, offsets[r])));
    }
  }
  const std::size_t tensors = spec.tensor_names.size();
  for (std::size_t k = 0; k < spec.tensor_metric_names.size(); ++k) {
    const std::string name = "/tensors/" + spec.tensor_metric_names[k];
    CHECK(file.dims(name.c_str()) == std::vector<hsize_t>{steps.size(), tensors});
    const auto values = file.read<double>(name.c_str(), H5T_NATIVE_DOUBLE);
    REQUIRE(values.size() == steps.size() * tensors);
    for (std::size_t r = 0; r < steps.size(); ++r)
      for (std::size_t t = 0; t < tensors; ++t) CHECK(values[r * tensors + t] == tensor_value(steps[r], k, t, offsets[r]));
  }
}

std::vector<long> step_range(long first, long last) {
  std::vector<long> out;
  for (long s = first; s <= last; ++s) out.push_back(s);
  return out;
}

}  // namespace

TEST_CASE("a run file round-trips every value exactly through the C API") {
  TempDir dir;
  const fs::path path = dir / "run.h5";
  RunFileSpec spec = test_spec(3);
  spec.final_params_size = 5;
  const std::vector<float> params = {1.5f, -2.0f, 3.25f, std::numeric_limits<float>::quiet_NaN(), 1e-3f};
  {
    RunRecorder recorder = create_with_steps(path, spec, 11);
    recorder.append_eval(5, 2.5);
    recorder.append_eval(10, 2.25);
    recorder.write_final_params(params);
    recorder.set_status("completed");
  }

  const RawFile file(path, false);  // a closed run file opens without SWMR
  REQUIRE(file.ok());
  check_rows(file, spec, step_range(1, 11), std::vector<double>(11, 0.0));
  CHECK(file.read<std::int64_t>("/eval/step", H5T_NATIVE_INT64) == std::vector<std::int64_t>{5, 10});
  CHECK(file.read<double>("/eval/val_loss", H5T_NATIVE_DOUBLE) == std::vector<double>{2.5, 2.25});
  const auto stored_params = file.read<float>("/final/params", H5T_NATIVE_FLOAT);
  REQUIRE(stored_params.size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) CHECK(same(stored_params[i], params[i]));
  CHECK(file.string_attr("config") == spec.config_json);
  CHECK(file.string_attr("status") == "completed");
  CHECK(file.string_attr("error").empty());
  CHECK(file.string_attr("scape_version") == "0.1.0");
  CHECK(file.string_attr("git_sha") == spec.git_sha);
  CHECK(file.int_attr("steps_completed") == 11);
  CHECK(file.int_attr("layout_version") == 1);

  if (fs::exists("/usr/bin/h5dump")) {
    CHECK(std::system(("/usr/bin/h5dump '" + path.string() + "' >/dev/null 2>&1").c_str()) == 0);
  }
  if (!have_h5py()) {
    MESSAGE("skipping the h5py read: /usr/bin/python3 with h5py and numpy not found");
    return;
  }
  CHECK(h5py_check(dir, path, H5pyOpen::plain, R"(
ok = (f.attrs["status"] == "completed" and int(f.attrs["steps_completed"]) == 11
      and int(f.attrs["layout_version"]) == 1 and "scape" in f.attrs["config"]
      and list(f["metrics/step"][:]) == list(range(1, 12))
      and np.isnan(f["metrics/mask_jaccard"][0::2]).all() and f["metrics/loss"][10] == 110.125
      and f["tensors/mask_density"].shape == (11, 3)
      and [n.decode() for n in f["tensors/names"][:]] == ["wte", "h0.attn.w", "h0.attn.b"])
sys.exit(0 if ok else 1)
)") == 0);
}

TEST_CASE("rows reach the file every flush_interval steps") {
  if (skip_without_h5py()) return;
  TempDir dir;
  const fs::path path = dir / "run.h5";
  const RunFileSpec spec = test_spec(3);
  RunRecorder recorder = create_with_steps(path, spec, 7);
  recorder.append_eval(7, 1.0);
  // While the writer is live, a SWMR reader sees the two flushes (steps 1..6) and nothing else.
  CHECK(h5py_check(dir, path, H5pyOpen::swmr, R"(
ok = (list(f["metrics/step"][:]) == [1, 2, 3, 4, 5, 6] and f["metrics/lr"].shape == (6,)
      and f["tensors/residual_norm"].shape == (6, 3) and f["eval/step"].shape == (0,)
      and int(f.attrs["steps_completed"]) == 6 and f.attrs["status"] == "running")
sys.exit(0 if ok else 1)
)") == 0);
  recorder.flush();
  CHECK(h5py_check(dir, path, H5pyOpen::swmr, R"(
sys.exit(0 if list(f["metrics/step"][:]) == list(range(1, 8)) and list(f["eval/step"][:]) == [7] else 1)
)") == 0);
}

TEST_CASE("status, error and steps_completed round-trip through read_run_summary") {
  TempDir dir;
  const fs::path path = dir / "run.h5";
  const RunFileSpec spec = test_spec(4);
  const std::string long_error = "loss exploded: 1e38 \xe2\x86\x92 inf; " + std::string(10000, 'x');
  {
    RunRecorder recorder = create_with_steps(path, spec, 6);
    recorder.set_status("diverged", "short");
    recorder.set_status("failed", long_error);
    CHECK_THROWS_AS(recorder.set_status("finished"), std::invalid_argument);
  }
  RunFileSummary summary = read_run_summary(path);
  CHECK(summary.status == "failed");
  CHECK(summary.error == long_error);
  CHECK(summary.steps_completed == 6);
  CHECK(summary.config_json == spec.config_json);

  {
    RunRecorder recorder = RunRecorder::open_for_resume(path, spec, 6);
    CHECK(read_run_summary(path).status == "running");  // rewritten before SWMR, visible to readers
    append(recorder, spec, 7);
    recorder.set_status("completed");
  }
  summary = read_run_summary(path);
  CHECK(summary.status == "completed");
  CHECK(summary.error.empty());
  CHECK(summary.steps_completed == 7);
}

TEST_CASE("read_run_summary names the file it cannot read") {
  TempDir dir;
  const fs::path missing = dir / "missing.h5";
  std::string error = error_of([&] { read_run_summary(missing); });
  CHECK(error.find(missing.string()) != std::string::npos);
  CHECK(error.find("no such file") != std::string::npos);
  CHECK_THROWS_AS(read_run_summary(missing), H5Error);

  const fs::path text = dir / "notes.h5";
  std::ofstream(text) << "not an HDF5 file\n";
  error = error_of([&] { read_run_summary(text); });
  CHECK(error.find(text.string()) != std::string::npos);
  CHECK(error.find("not an HDF5 file") != std::string::npos);

  const fs::path other = dir / "other.h5";
  {
    const File file = File::create(other);
    file.create_dataset("x", H5T_IEEE_F64LE, DatasetShape{{3}, {}, {}, {}});
  }
  error = error_of([&] { read_run_summary(other); });
  CHECK(error.find(other.string()) != std::string::npos);
  CHECK(error.find("not a scape run file") != std::string::npos);

  const fs::path future = dir / "future.h5";
  {
    const File file = File::create(future);
    file.write_string_attribute("config", "{}");
    file.write_int_attribute("layout_version", 2);
  }
  error = error_of([&] { read_run_summary(future); });
  CHECK(error.find(future.string()) != std::string::npos);
  CHECK(error.find("layout_version 2") != std::string::npos);
}

// What a failing HDF5 call prints on stderr while `body` runs on a thread of its own.
std::string stderr_of_thread(const std::function<void()>& body) {
  TempDir dir;
  const fs::path log = dir / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int sink = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(sink, 2);
  std::thread(body).join();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(sink);
  ::close(saved);
  std::ifstream in(log);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_CASE("the recorder rejects malformed appends and unwritable paths") {
  TempDir dir;
  const fs::path path = dir / "run.h5";
  const RunFileSpec spec = test_spec(3);
  RunRecorder recorder = create_with_steps(path, spec, 1);
  CHECK_THROWS_AS(append(recorder, spec, 1), std::invalid_argument);
  const std::vector<double> too_few = {1.0};
  CHECK_THROWS_AS(recorder.append_step(2, too_few, {}), std::invalid_argument);
  CHECK_THROWS_AS(recorder.write_final_params(std::vector<float>(3)), std::invalid_argument);
  recorder.append_eval(4, 1.0);
  CHECK_THROWS_AS(recorder.append_eval(4, 1.0), std::invalid_argument);

  RunFileSpec bad = spec;
  bad.metric_names.push_back("step");
  CHECK_THROWS_AS(RunRecorder::create(dir / "bad.h5", bad), std::invalid_argument);

  const fs::path unwritable = dir / "no" / "such" / "dir" / "run.h5";
  const std::string error = error_of([&] { RunRecorder::create(unwritable, spec); });
  CHECK(error.find(unwritable.string()) != std::string::npos);
}

TEST_CASE("a SIGKILLed run keeps every flushed step, and resumes") {
  TempDir dir;
  const fs::path path = dir / "killed.h5";
  const RunFileSpec spec = test_spec(5);

  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      RunRecorder recorder = create_with_steps(path, spec, 20);  // flushes at 5, 10, 15, 20
      recorder.flush();
      for (long step = 21; step <= 23; ++step) append(recorder, spec, step);  // buffered only
      raise(SIGKILL);
    } catch (...) {
      _exit(3);
    }
    _exit(4);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);

  const RunFileSummary summary = read_run_summary(path);
  CHECK(summary.status == "running");
  CHECK(summary.steps_completed == 20);
  // The plain open that fails before the SWMR one is silent on every thread (a sweep's parallel
  // points check their files on their own threads), not HDF5-DIAG text on stderr.
  long steps_seen_by_thread = 0;
  const std::string printed = stderr_of_thread([&] { steps_seen_by_thread = read_run_summary(path).steps_completed; });
  CHECK(steps_seen_by_thread == 20);
  CHECK(printed == "");
  {
    const RawFile file(path);
    REQUIRE(file.ok());
    check_rows(file, spec, step_range(1, 20), std::vector<double>(20, 0.0));
    CHECK(file.string_attr("status") == "running");
  }
  const bool python = have_h5py();
  if (python) {
    CHECK(h5py_check(dir, path, H5pyOpen::swmr, R"(
loss = f["metrics/loss"][:]
ok = (list(f["metrics/step"][:]) == list(range(1, 21)) and f.attrs["status"] == "running"
      and (loss == np.arange(1, 21) * 10.0 + 0.125).all() and f["tensors/mask_density"].shape == (20, 3))
sys.exit(0 if ok else 1)
)") == 0);
  } else {
    MESSAGE("skipping the h5py read: /usr/bin/python3 with h5py and numpy not found");
  }

  // Resuming clears the killed writer's flags; the closed file then opens for plain readers.
  {
    RunRecorder recorder = RunRecorder::open_for_resume(path, spec, 20);
    for (long step = 21; step <= 22; ++step) append(recorder, spec, step);
    recorder.set_status("completed");
  }
  {
    const RawFile file(path, false);
    REQUIRE(file.ok());
    check_rows(file, spec, step_range(1, 22), std::vector<double>(22, 0.0));
  }
  if (python) {
    CHECK(h5py_check(dir, path, H5pyOpen::plain, R"(
sys.exit(0 if list(f["metrics/step"][:]) == list(range(1, 23)) and f.attrs["status"] == "completed" else 1)
)") == 0);
  }
}

TEST_CASE("open_for_resume drops the rows after steps_completed and continues") {
  TempDir dir;
  const fs::path path = dir / "run.h5";
  const RunFileSpec spec = test_spec(3);
  {
    RunRecorder recorder = create_with_steps(path, spec, 10);
    for (long step : {3, 6, 9}) recorder.append_eval(step, static_cast<double>(step) / 4.0);
  }
  {
    // Resumed and closed at once: every dataset already holds just steps 1..8.
    RunRecorder::open_for_resume(path, spec, 8);
    const RawFile file(path, false);
    REQUIRE(file.ok());
    check_rows(file, spec, step_range(1, 8), std::vector<double>(8, 0.0));
    CHECK(file.read<std::int64_t>("/eval/step", H5T_NATIVE_INT64) == std::vector<std::int64_t>{3, 6});
    CHECK(file.read<double>("/eval/val_loss", H5T_NATIVE_DOUBLE) == std::vector<double>{0.75, 1.5});
  }
  {
    RunRecorder recorder = RunRecorder::open_for_resume(path, spec, 6);
    CHECK(recorder.last_step() == 6);
    CHECK_THROWS_AS(append(recorder, spec, 6), std::invalid_argument);
    for (long step = 7; step <= 9; ++step) append(recorder, spec, step, 1000.0);  // tell resumed rows apart
    recorder.append_eval(8, 7.0);
    recorder.set_status("completed");
  }
  const RawFile file(path, false);
  REQUIRE(file.ok());
  std::vector<double> offsets(9, 0.0);
  for (std::size_t r = 6; r < 9; ++r) offsets[r] = 1000.0;
  check_rows(file, spec, step_range(1, 9), offsets);
  CHECK(file.read<std::int64_t>("/eval/step", H5T_NATIVE_INT64) == std::vector<std::int64_t>{3, 6, 8});
  CHECK(file.read<double>("/eval/val_loss", H5T_NATIVE_DOUBLE) == std::vector<double>{0.75, 1.5, 7.0});
  CHECK(file.int_attr("steps_completed") == 9);
  CHECK(file.string_attr("status") == "completed");
}

TEST_CASE("open_for_resume refuses a run file that does not match the spec") {
  TempDir dir;
  const fs::path path = dir / "run.h5";
  const RunFileSpec spec = test_spec(3);
  create_with_steps(path, spec, 1);  // and closed at once
  RunFileSpec more = spec;
  more.metric_names.push_back("grad_norm");
  std::string error = error_of([&] { RunRecorder::open_for_resume(path, more, 1); });
  CHECK(error.find(path.string()) != std::string::npos);
  CHECK(error.find("/metrics") != std::string::npos);

  RunFileSpec renamed = spec;
  renamed.tensor_names[1] = "h0.mlp.w";
  error = error_of([&] { RunRecorder::open_for_resume(path, renamed, 1); });
  CHECK(error.find("/tensors/names") != std::string::npos);

  // The refused resumes left the file intact.
  CHECK(read_run_summary(path).steps_completed == 1);
}

TEST_CASE("metric descriptions become dataset attributes; a count that does not match is refused") {
  TempDir dir;
  const fs::path path = dir / "run.h5";
  RunFileSpec spec = test_spec(3);
  spec.metric_descriptions = {{"1", "mean", "the loss"}, {"1", "worker 0", "the rate"}, {"1", "worker 0", "overlap"}};
  spec.tensor_metric_descriptions = {{"1", "mean", "norm per tensor"}, {"1", "worker 0", "density per tensor"}};
  create_with_steps(path, spec, 1);  // and closed at once
  const File file = File::open(path, Access::read);
  const Dataset lr = file.open_dataset("metrics/lr");
  CHECK(lr.read_string_attribute("unit") == "1");
  CHECK(lr.read_string_attribute("combine") == "worker 0");
  CHECK(lr.read_string_attribute("doc") == "the rate");
  CHECK(file.open_dataset("tensors/mask_density").read_string_attribute("doc") == "density per tensor");
  CHECK_FALSE(file.open_dataset("metrics/step").has_attribute("unit"));

  RunFileSpec short_of_one = spec;
  short_of_one.metric_descriptions.pop_back();
  CHECK_THROWS_AS(RunRecorder::create(dir / "bad.h5", short_of_one), std::invalid_argument);
  // Without descriptions the datasets have no attributes (test_spec's other cases).
  {
    RunRecorder plain = RunRecorder::create(dir / "plain.h5", test_spec(3));
  }
  CHECK_FALSE(File::open(dir / "plain.h5", Access::read).open_dataset("metrics/lr").has_attribute("unit"));
}

TEST_CASE("optimizer_keys: written when the spec gives it, absent otherwise, and brought along by a resume") {
  TempDir dir;
  const std::string table = R"({"lr":["adams","scape"],"sparsity":["scape"]})";
  RunFileSpec with = test_spec(3);
  with.optimizer_keys_json = table;
  {
    RunRecorder recorder = create_with_steps(dir / "with.h5", with, 4);
    recorder.set_status("completed");
  }
  CHECK(File::open(dir / "with.h5", Access::read).read_string_attribute("optimizer_keys") == table);
  {
    RunRecorder recorder = create_with_steps(dir / "without.h5", test_spec(3), 4);
  }
  CHECK_FALSE(File::open(dir / "without.h5", Access::read).has_attribute("optimizer_keys"));
  // A file written before the attribute existed gains the table of the scape that resumes it.
  {
    RunRecorder resumed = RunRecorder::open_for_resume(dir / "without.h5", with, 3);
    append(resumed, with, 4);
    resumed.set_status("completed");
  }
  const File resumed = File::open(dir / "without.h5", Access::read);
  CHECK(resumed.read_string_attribute("optimizer_keys") == table);
  CHECK(resumed.read_int_attribute("steps_completed") == 4);
}
