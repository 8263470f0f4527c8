// Failures a long sweep must survive (issue 18): a run file or checkpoint that cannot be
// written (file-size limit, a folder that cannot be written), corrupt checkpoints, killed runs
// repaired to open plainly, --out folders and other configs' files, --resume with a changed
// config. The inputs the fuzz targets found: tests/test_fuzz_regressions.cpp.
//
// Unwritable folders: the tests run as root, which ignores directory permissions, so a folder
// that cannot be written is made another way: a path whose parent is a regular file (ENOTDIR),
// or a folder standing where the file must be created (EISDIR).
#include <doctest/doctest.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include "config/config.hpp"
#include "kernels/backend.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "test_support.hpp"
#include "train/checkpoint.hpp"
#include "train/gradient_source.hpp"
#include "train/train_loop.hpp"

namespace fs = std::filesystem;
namespace cfg = scape::config;
namespace tr = scape::train;
using scape::testing::TempDir;

namespace {

using scape::testing::run_scape;

void write_file(const fs::path& p, const std::string& text) { scape::testing::write_text_file(p, text); }

using scape::testing::read_file;

using scape::run_file::opens_plainly;

std::vector<double> read_metric(const fs::path& file, const std::string& name) {
  return scape::run_file::File::open(file, scape::run_file::Access::read).open_dataset("/metrics/" + name).read_all<double>();
}

const std::string kQuadratic = scape::testing::quadratic_scape_config(4000);

cfg::ExperimentConfig small_config(const fs::path& dir, const std::string& sets = "") {
  nlohmann::json j = {{"name", "ck"}, {"workers", 2}, {"steps", 10},
                      {"model", {{"type", "quadratic"}, {"size", 64}}}, {"optimizer", {{"type", "adams"}}}};
  if (!sets.empty()) cfg::apply_override(j, sets);
  return cfg::parse_experiment(j, dir);
}

std::uint64_t fnv1a_by_hand(const std::string& bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Runs f in a child process with a file-size limit (bytes) and SIGXFSZ ignored; returns the
// child's exit status (f's return value, or that of the program f executes).
template <typename F>
int with_file_size_limit(rlim_t bytes, F&& f) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, bytes};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::_exit(f());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A run file of two metrics, a and b, flushed every `flush_interval` rows.
scape::run_file::RunFileSpec two_metrics(int flush_interval) {
  scape::run_file::RunFileSpec spec;
  spec.metric_names = {"a", "b"};
  spec.flush_interval = flush_interval;
  return spec;
}

}  // namespace

TEST_CASE("checkpoints: SCAPECK2 bytes by hand, a checksum that refuses any damaged byte, durable replacement") {
  TempDir dir;
  const auto config = small_config(dir.path);
  const std::string json = config.to_json().dump();
  scape::StateMap s0, s1;
  scape::put_state_value(s0, "t", 4);
  scape::put_state(s1, "v", std::vector<float>{0.5f});
  const std::vector<float> params = {1.0f, 2.0f, 3.0f};
  const auto run_file = dir / "run.h5";
  tr::write_checkpoint(tr::checkpoint_path(run_file), json, 4, {s0, s1}, params);
  CHECK_FALSE(fs::exists(tr::checkpoint_path(run_file).string() + ".tmp"));

  std::ostringstream body(std::ios::binary);
  auto u64 = [&](std::uint64_t x) { body.write(reinterpret_cast<const char*>(&x), sizeof x); };
  body << "SCAPECK2";
  u64(json.size());
  body << json;
  u64(4);
  u64(2);
  body << tr::encode_state_map(s0) << tr::encode_state_map(s1);
  u64(params.size() * sizeof(float));
  body.write(reinterpret_cast<const char*>(params.data()), static_cast<std::streamsize>(params.size() * sizeof(float)));
  std::string expected = body.str();
  const std::uint64_t sum = fnv1a_by_hand(expected);
  expected.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  const std::string bytes = read_file(tr::checkpoint_path(run_file));
  REQUIRE(bytes == expected);

  const tr::Checkpoint c = tr::load_checkpoint(config, run_file, 3);
  CHECK(c.step == 4);
  CHECK(c.states == std::vector<scape::StateMap>{s0, s1});
  CHECK(c.params == params);

  // Every single damaged byte (in the config, the states, the parameters or the checksum) is
  // refused, naming the file; so is every truncation.
  for (std::size_t i = 0; i < bytes.size(); i += 7) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    std::ofstream(tr::checkpoint_path(run_file), std::ios::binary | std::ios::trunc) << bad;
    CHECK_THROWS_WITH_AS(tr::load_checkpoint(config, run_file, 3),
                         doctest::Contains((tr::checkpoint_path(run_file).string() + ": corrupt checkpoint").c_str()),
                         cfg::ConfigError);
  }
  std::ofstream(tr::checkpoint_path(run_file), std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 3);
  CHECK_THROWS_WITH_AS(tr::load_checkpoint(config, run_file, 3), doctest::Contains("checksum mismatch"),
                       cfg::ConfigError);
}

TEST_CASE("--resume may change steps and log.* only; other keys are listed and refused") {
  TempDir dir;
  const auto config = small_config(dir.path);
  const auto run_file = dir / "run.h5";
  const std::vector<float> params = {1, 2, 3};
  tr::write_checkpoint(tr::checkpoint_path(run_file), config.to_json().dump(), 4, {{}, {}}, params);
  CHECK(tr::load_checkpoint(small_config(dir.path, "steps=50"), run_file, 3).step == 4);
  CHECK(tr::load_checkpoint(small_config(dir.path, "log.flush_interval=3"), run_file, 3).step == 4);
  CHECK_THROWS_WITH_AS(tr::load_checkpoint(small_config(dir.path, "optimizer.lr=0.5"), run_file, 3),
                       doctest::Contains("these keys differ from the checkpoint's: optimizer.lr (0.0006 -> 0.5), "
                                         "optimizer.min_lr (5.9999999999999995e-05 -> 0.05)"),
                       cfg::ConfigError);
  const std::string both = scape::testing::error_of(
      [&] { tr::load_checkpoint(small_config(dir.path, "seed=9"), run_file, 3); });
  CHECK(both.find("seed (1 -> 9)") != std::string::npos);
}

TEST_CASE("a checkpoint that cannot be written leaves the last good one and no temporary file") {
  TempDir dir;
  const auto config = small_config(dir.path);
  const auto run_file = dir / "run.h5";
  const auto path = tr::checkpoint_path(run_file);
  const std::vector<float> small = {1, 2, 3};
  tr::write_checkpoint(path, config.to_json().dump(), 2, {{}, {}}, small);
  const std::string good = read_file(path);

  // A file-size limit below the new checkpoint's size.
  scape::StateMap big;
  scape::put_state(big, "m", std::vector<float>(100000, 1.5f));
  const int code = with_file_size_limit(64 * 1024, [&] {
    try {
      tr::write_checkpoint(path, config.to_json().dump(), 6, {big, big}, small);
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      return m.find(path.string() + ".tmp at step 6: write failed: File too large") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  CHECK(code == 0);
  CHECK(read_file(path) == good);
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  CHECK(tr::load_checkpoint(config, run_file, 3).step == 2);

  // A folder where the temporary file must go (EISDIR: works as root too).
  fs::create_directories(path.string() + ".tmp");
  CHECK_THROWS_WITH_AS(tr::write_checkpoint(path, config.to_json().dump(), 8, {{}, {}}, small),
                       doctest::Contains((path.string() + ".tmp at step 8: cannot create: Is a directory").c_str()),
                       std::runtime_error);
  CHECK(read_file(path) == good);
}

TEST_CASE("a run file that hits a file-size limit: exit 1 naming file and steps, flushed steps open plainly") {
  TempDir dir;
  write_file(dir / "q.json", kQuadratic);
  const auto full = run_scape("run " + (dir / "q.json").string() + " --out " + (dir / "full.h5").string() + " --quiet");
  REQUIRE(full.code == 0);
  const fs::path limited = dir / "limited.h5";
  // The limit is set in a child (setrlimit), which then runs scape: scape itself ignores SIGXFSZ.
  const fs::path log = dir / "limited.log";
  const int code = with_file_size_limit(400 * 1024, [&] {
    const std::string command = std::string(SCAPE_BINARY) + " run " + (dir / "q.json").string() + " --out " +
                                limited.string() + " --quiet > " + log.string() + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    return 127;
  });
  scape::testing::CommandResult r;
  r.code = code;
  r.output = read_file(log);
  CAPTURE(r.output);
  CHECK(r.code == 1);
  CHECK(r.output.find("run file '" + limited.string() + "': cannot write steps ") != std::string::npos);
  CHECK(r.output.find("File too large") != std::string::npos);
  REQUIRE(opens_plainly(limited));
  const auto s = scape::run_file::read_run_summary(limited);
  CHECK(s.status == "failed");
  CHECK(s.steps_completed > 100);
  CHECK(r.output.find("the steps up to " + std::to_string(s.steps_completed) + " are kept") != std::string::npos);
  const auto kept = read_metric(limited, "train_loss");
  const auto reference = read_metric(dir / "full.h5", "train_loss");
  REQUIRE(static_cast<long>(kept.size()) == s.steps_completed);
  for (std::size_t t = 0; t < kept.size(); ++t) CHECK(kept[t] == reference[t]);
  CHECK(fs::file_size(limited) <= 400 * 1024);
  if (!scape::testing::skip_without_h5py()) {
    const auto py = scape::testing::run_command(
        "/usr/bin/python3 -c \"import h5py; f = h5py.File('" + limited.string() +
        "', 'r'); print('rows', f['metrics/step'].shape[0])\"");
    CHECK(py.output.find("rows " + std::to_string(s.steps_completed)) != std::string::npos);
  }
}

TEST_CASE("a run whose only flush, at its end, hits a file-size limit ends failed, not running") {
  TempDir dir;
  write_file(dir / "q.json", kQuadratic);
  const fs::path limited = dir / "late.h5";
  const fs::path log = dir / "late.log";
  // No flush before the end: all 4000 rows wait for finish(), and they need more than 400 KiB.
  const int code = with_file_size_limit(400 * 1024, [&] {
    const std::string command = std::string(SCAPE_BINARY) + " run " + (dir / "q.json").string() + " --out " +
                                limited.string() + " --quiet --set log.flush_interval=100000 > " + log.string() +
                                " 2>&1";
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    return 127;
  });
  const std::string output = read_file(log);
  CAPTURE(output);
  CHECK(code == 1);
  CHECK(output.find("run file '" + limited.string() + "': cannot write steps 1..4000") != std::string::npos);
  REQUIRE(opens_plainly(limited));
  const auto s = scape::run_file::read_run_summary(limited);
  CHECK(s.status == "failed");
  CHECK(s.steps_completed == 0);
  CHECK(s.error.find("cannot write steps 1..4000") != std::string::npos);
  CHECK(s.error.find("the steps up to 0 are kept") != std::string::npos);
}

TEST_CASE("a recorder stopped by a file-size limit keeps its flushed rows and refuses later writes") {
  TempDir dir;
  const fs::path path = dir / "rec.h5";
  const scape::run_file::RunFileSpec spec = two_metrics(/*flush_interval=*/4);
  const int code = with_file_size_limit(150 * 1024, [&] {
    auto recorder = scape::run_file::RunRecorder::create(path, spec);
    long step = 1;
    try {
      for (; step < 1000000; ++step) {
        const double row[2] = {0.5 * static_cast<double>(step), -static_cast<double>(step)};
        recorder.append_step(step, row);
      }
    } catch (const scape::run_file::H5Error& e) {
      // Later writes fail with the same message, without touching the file.
      const std::string first = e.what();
      const std::string again = scape::testing::error_of([&] { recorder.flush(); });
      recorder.set_status("failed", first);
      recorder.close();
      return again == first && first.find("cannot write steps") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  REQUIRE(code == 0);
  REQUIRE(opens_plainly(path));
  const auto s = scape::run_file::read_run_summary(path);
  CHECK(s.status == "failed");
  CHECK(s.error.find("are kept") != std::string::npos);
  const auto file = scape::run_file::File::open(path, scape::run_file::Access::read);
  const auto steps = file.open_dataset("metrics/step").read_all<std::int64_t>();
  const auto a = file.open_dataset("metrics/a").read_all<double>();
  REQUIRE(static_cast<long>(steps.size()) == s.steps_completed);
  CHECK(s.steps_completed % 4 == 0);
  CHECK(s.steps_completed > 1000);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    CHECK(steps[i] == static_cast<std::int64_t>(i + 1));
    CHECK(a[i] == 0.5 * static_cast<double>(i + 1));
  }
}

TEST_CASE("a checkpoint that cannot be written mid-run: exit 1 naming it and the step; the run file keeps its steps") {
  TempDir dir;
  write_file(dir / "q.json", kQuadratic);
  const fs::path out = dir / "c.h5";
  fs::create_directories(out.string() + ".ckpt.tmp");  // the temporary checkpoint cannot be created
  const auto r = run_scape("run " + (dir / "q.json").string() + " --out " + out.string() +
                           " --quiet --set steps=20 --checkpoint-every 10");
  CAPTURE(r.output);
  CHECK(r.code == 1);
  CHECK(r.output.find("checkpoint " + out.string() + ".ckpt.tmp at step 10: cannot create: Is a directory") !=
        std::string::npos);
  REQUIRE(opens_plainly(out));
  const auto s = scape::run_file::read_run_summary(out);
  CHECK(s.status == "failed");
  CHECK(s.steps_completed == 10);
  CHECK(read_metric(out, "train_loss").size() == 10);
}

TEST_CASE("a killed run's file opens plainly after scape repair, marked killed, and still resumes") {
  TempDir dir;
  write_file(dir / "q.json", kQuadratic);
  const fs::path killed = dir / "k.h5";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(SCAPE_BINARY, SCAPE_BINARY, "run", (dir / "q.json").c_str(), "--out", killed.c_str(), "--quiet",
            "--checkpoint-every", "20", "--set", "steps=1000000", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(killed.string() + ".ckpt") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  CHECK_FALSE(opens_plainly(killed));
  const auto before = scape::run_file::read_run_summary(killed);
  REQUIRE(before.status == "running");

  const auto r = run_scape("repair " + killed.string());
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("cleared the flags of a writer that never closed; status killed (was running); " +
                      std::to_string(before.steps_completed) + " steps kept") != std::string::npos);
  REQUIRE(opens_plainly(killed));
  const auto after = scape::run_file::read_run_summary(killed);
  CHECK(after.status == "killed");
  CHECK(after.steps_completed == before.steps_completed);
  CHECK(after.error.find("after step " + std::to_string(before.steps_completed)) != std::string::npos);
  CHECK(static_cast<long>(read_metric(killed, "train_loss").size()) == before.steps_completed);
  // A second repair finds nothing to clear; a file that is not a run file is refused.
  CHECK(run_scape("repair " + killed.string()).output.find("was closed cleanly; status killed;") != std::string::npos);
  CHECK(run_scape("repair " + (dir / "q.json").string()).code == 2);

  // The repaired run resumes from its checkpoint, with fewer steps now (allowed on --resume).
  const auto resumed = run_scape("run " + (dir / "q.json").string() + " --out " + killed.string() +
                                 " --quiet --resume --set steps=" + std::to_string(before.steps_completed + 7));
  CAPTURE(resumed.output);
  CHECK(resumed.code == 0);
  CHECK(scape::run_file::read_run_summary(killed).status == "completed");
  CHECK(nlohmann::json::parse(scape::run_file::read_run_summary(killed).config_json).at("steps") == before.steps_completed + 7);
}

TEST_CASE("scape repair: a table shorter than steps_completed claims (a kill in mid-flush) lowers it, nothing else") {
  // HDF5 wrote the extents of one flush in no set order, so a writer killed inside a flush
  // could leave steps_completed (and /metrics/step) ahead of another table (CI, 2026-12-01).
  TempDir dir;
  const fs::path p = dir / "short.h5";
  const scape::run_file::RunFileSpec spec = two_metrics(/*flush_interval=*/1);
  {
    auto recorder = scape::run_file::RunRecorder::create(p, spec);
    for (long step = 1; step <= 5; ++step) {
      const double row[2] = {static_cast<double>(step), 10.0 * step};
      recorder.append_step(step, row);
    }
    recorder.append_eval(2, 0.5);
    recorder.append_eval(4, 0.25);
    recorder.close();
  }
  {
    const scape::run_file::File f = scape::run_file::File::open(p, scape::run_file::Access::read_write);
    f.open_dataset("metrics/b").set_extent({3});  // the flushes of steps 4 and 5 never reached 'b'
    f.write_string_attribute("status", "running");
    f.write_string_attribute("checksums", "");  // a killed writer never wrote them
  }
  CHECK_THROWS_WITH_AS(scape::run_file::RunRecorder::open_for_resume(p, spec, 5),
                       doctest::Contains("'/metrics/b' has fewer rows than '/metrics/step'"), scape::run_file::H5Error);

  const auto r = run_scape("repair " + p.string());
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("status killed (was running); 3 steps kept; steps_completed lowered from 5") != std::string::npos);
  const auto after = scape::run_file::read_run_summary(p);
  CHECK(after.steps_completed == 3);
  CHECK(after.error.find("after step 5") != std::string::npos);
  CHECK(after.error.find("held the steps up to 3 only") != std::string::npos);
  CHECK(read_metric(p, "a") == std::vector<double>{1, 2, 3});
  CHECK(read_metric(p, "b") == std::vector<double>{10, 20, 30});
  CHECK(read_metric(p, "step") == std::vector<double>{1, 2, 3});
  {
    const scape::run_file::File f = scape::run_file::File::open(p, scape::run_file::Access::read);
    CHECK(f.open_dataset("eval/step").read_all<std::int64_t>() == std::vector<std::int64_t>{2});
    CHECK(f.open_dataset("eval/val_loss").read_all<double>() == std::vector<double>{0.5});
  }
  // The repaired file resumes from the steps it holds.
  auto resumed = scape::run_file::RunRecorder::open_for_resume(p, spec, 3);
  const double row[2] = {4.0, 40.0};
  resumed.append_step(4, row);
  resumed.close();
  CHECK(read_metric(p, "b") == std::vector<double>{10, 20, 30, 40});
}

TEST_CASE("--out: a missing folder is created; another config's file or a non-run file needs --force") {
  TempDir dir;
  write_file(dir / "q.json", kQuadratic);
  const std::string run = "run " + (dir / "q.json").string() + " --quiet --set steps=6 --out ";
  const fs::path nested = dir / "new" / "deeper" / "r.h5";
  CHECK(run_scape(run + nested.string()).code == 0);
  CHECK(scape::run_file::read_run_summary(nested).status == "completed");
  CHECK(run_scape(run + nested.string()).code == 0);  // the same config again: a rerun

  auto other = run_scape(run + nested.string() + " --set optimizer.lr=0.5");
  CHECK(other.code == 2);
  CHECK(other.output.find("--out " + nested.string() + ": the file exists and is the run file of another config") !=
        std::string::npos);
  CHECK(other.output.find("add --force") != std::string::npos);
  write_file(dir / "notes.txt", "keep me");
  other = run_scape(run + (dir / "notes.txt").string());
  CHECK(other.code == 2);
  CHECK(other.output.find("is not a scape run file") != std::string::npos);
  CHECK(read_file(dir / "notes.txt") == "keep me");
  CHECK(run_scape(run + nested.string() + " --set optimizer.lr=0.5 --force").code == 0);
  CHECK(nlohmann::json::parse(scape::run_file::read_run_summary(nested).config_json)["optimizer"]["lr"] == 0.5);

  // A folder that cannot be created (its parent is a regular file): the --out given is wrong,
  // exit 2 naming it (exit 1 until 2026-12-07).
  const auto blocked = run_scape(run + (dir / "notes.txt" / "r.h5").string());
  CHECK(blocked.code == 2);
  CHECK(blocked.output.find("cannot create its folder (Not a directory)") != std::string::npos);
}

namespace {

// A communicator of one rank (every collective is a copy) that records when it is aborted and
// how many bytes the CPU backends still held then: what a device rank would still hold.
class SoloComm final : public scape::Communicator {
 public:
  SoloComm() : Communicator(0, 1, {}) {}
  void abort() noexcept override {
    ++aborts;
    live_at_abort = scape::kernels::cpu_allocations().live;
  }
  int aborts = 0;
  std::size_t live_at_abort = 0;

 protected:
  void do_all_reduce_mean(std::span<float>) override {}
  void do_reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                              std::span<const std::size_t>) override {
    std::copy_n(send.begin(), recv.size(), recv.begin());
  }
  void do_all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                           std::span<const std::size_t>) override {
    std::copy(send.begin(), send.end(), recv.begin());
  }
  std::unique_ptr<scape::AsyncRequest> do_all_gather_bytes_async(std::span<const std::byte> send,
                                                                 std::span<std::byte> recv,
                                                                 std::span<const std::size_t> counts) override {
    do_all_gather_bytes(send, recv, counts);
    struct Done final : scape::AsyncRequest {
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
  void do_all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                           std::span<const std::size_t>) override {
    std::copy(send.begin(), send.end(), recv.begin());
  }
  void do_barrier() override {}
};

class SoloExchange final : public tr::StepExchange {
 public:
  tr::StepVerdict exchange(
      int, const tr::WorkerReport& report,
      const std::function<tr::StepVerdict(std::span<const tr::WorkerReport* const>)>& decide) override {
    const tr::WorkerReport* all[] = {&report};
    return decide(all);
  }
  std::vector<scape::StateMap> gather_states(int, const scape::StateMap& mine) override { return {mine}; }
  void barrier(int) override {}
};

}  // namespace

// Issue: a NCCL rank whose peer failed may be stuck in a collective, and freeing device memory
// waits for the device, so a failing rank must abort its communicator before its Buffers are
// freed. train_rank's guard does that while the unwinding has freed nothing yet.
TEST_CASE("a failing rank aborts its communicator before any of its memory is freed; a good run never does") {
  TempDir dir;
  const auto config = cfg::parse_experiment(nlohmann::json::parse(R"({
      "workers": 1, "steps": 6,
      "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 64},
      "data": {"type": "synthetic", "batch_size": 2, "tokens": 20000},
      "optimizer": {"type": "scape", "sparsity": 0.9}, "eval": {"interval": 3, "batches": 1}})"),
                                            ".");
  const auto data = tr::load_source_data(config);
  const std::size_t rank_bytes = 2 * data->layout().size() * sizeof(float);  // parameters and gradients
  for (const bool fail : {false, true}) {
    CAPTURE(fail);
    tr::RunOptions options;
    options.out = dir.path / (fail ? "fail.h5" : "good.h5");
    options.quiet = true;
    if (fail) {
      options.before_step = [](int, int t) {
        if (t == 4) throw std::runtime_error("injected failure");
      };
    }
    tr::RunLog log(config, data->layout(), options, 0);
    SoloComm comm;
    SoloExchange exchange;
    const std::size_t before = scape::kernels::cpu_allocations().live;
    if (fail) {
      CHECK_THROWS_WITH(tr::train_rank(config, *data, options, comm, exchange, &log, nullptr), "injected failure");
      CHECK(comm.aborts == 1);
      CHECK(comm.live_at_abort >= before + rank_bytes);  // nothing of the rank freed yet
      CHECK(scape::kernels::cpu_allocations().live <= before);  // everything freed after
      CHECK(log.finish("step 4: injected failure").status == tr::RunStatus::failed);
    } else {
      tr::train_rank(config, *data, options, comm, exchange, &log, nullptr);
      CHECK(comm.aborts == 0);
      CHECK(log.finish("").status == tr::RunStatus::completed);
    }
  }
}
