// A run is never lost or lied about (issue 55): --resume to no further step is refused and keeps
// the checkpoint; one writer per run file (run, run --resume, repair), a stale lock taken over;
// SIGTERM and SIGINT stop a run at a step boundary, checkpointed and marked interrupted; a failing
// repair changes nothing; duplicate JSON keys are refused; a checkpoint is never resumed into
// another run's file; log.save_params may change on resume. Each case drives the scape command.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "config/config.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "run_file/run_lock.hpp"
#include "run_file/run_summary.hpp"
#include "run_file/table_checksums.hpp"
#include "test_support.hpp"
#include "train/checkpoint.hpp"

namespace fs = std::filesystem;
namespace cfg = scape::config;
namespace tr = scape::train;
using scape::testing::read_file;
using scape::testing::run_scape;
using scape::testing::TempDir;

namespace {

const std::string kLong = scape::testing::quadratic_scape_config(1000000);

// `scape ARGS...` started in the background, its output to `log`; returns its pid.
pid_t start_scape(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> argv = {SCAPE_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    ::execv(c[0], c.data());
    ::_exit(127);
  }
  return pid;
}

// Waits up to `seconds` for `done`; returns whether it came true.
bool wait_for(const std::function<bool()>& done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The exit status of `pid` (128 + signal when a signal ended it).
int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A long run with a checkpoint every 20 steps, killed with SIGKILL once its first checkpoint is
// on the disk: its file still says running, its checkpoint is good.
// `extra`: more arguments of the run (--set ...).
void killed_run(const TempDir& dir, const fs::path& out, const std::vector<std::string>& extra = {}) {
  scape::testing::write_text_file(dir / "q.json", kLong);
  std::vector<std::string> args = {"run", (dir / "q.json").string(), "--out", out.string(), "--quiet",
                                   "--checkpoint-every", "20"};
  args.insert(args.end(), extra.begin(), extra.end());
  const pid_t pid = start_scape(args, dir / "killed.log");
  REQUIRE(wait_for([&] { return fs::exists(tr::checkpoint_path(out)); }, 120));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(pid, SIGKILL);
  wait_exit(pid);
}

int checkpoint_step(const TempDir& dir, const fs::path& out) {
  const auto config = cfg::parse_experiment(nlohmann::json::parse(kLong), dir.path);
  return tr::load_checkpoint(config, out, 2000).step;
}

}  // namespace

TEST_CASE("--resume with steps at or below the checkpoint's step: exit 2 naming both; checkpoint and file kept") {
  TempDir dir;
  const fs::path out = dir / "r.h5";
  killed_run(dir, out);
  const int step = checkpoint_step(dir, out);
  REQUIRE(step >= 20);
  const std::string checkpoint = read_file(tr::checkpoint_path(out));
  const std::string file = read_file(out);
  const std::string resume = "run " + (dir / "q.json").string() + " --out " + out.string() + " --quiet --resume";
  for (const int steps : {step, step - 7}) {
    const auto r = run_scape(resume + " --set steps=" + std::to_string(steps));
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find("--resume with steps " + std::to_string(steps) + ", at or below the checkpoint's step " +
                        std::to_string(step)) != std::string::npos);
    CHECK(read_file(tr::checkpoint_path(out)) == checkpoint);
    CHECK(read_file(out) == file);
  }
  // One step further is a run: it resumes and completes.
  const auto r = run_scape(resume + " --set steps=" + std::to_string(step + 1));
  CAPTURE(r.output);
  CHECK(r.code == 0);
  const auto summary = scape::run_file::read_run_summary(out);
  CHECK(summary.status == "completed");
  CHECK(summary.steps_completed == step + 1);
  CHECK_FALSE(fs::exists(tr::checkpoint_path(out)));
}

TEST_CASE(
    "one writer per run file: run, --resume and repair of a live run exit 2 naming it; a killed one's lock is taken "
    "over") {
  TempDir dir;
  const fs::path out = dir / "live.h5";
  scape::testing::write_text_file(dir / "q.json", kLong);
  const pid_t pid =
      start_scape({"run", (dir / "q.json").string(), "--out", out.string(), "--quiet", "--checkpoint-every", "20"},
                  dir / "live.log");
  REQUIRE(wait_for([&] { return fs::exists(tr::checkpoint_path(out)); }, 120));
  const auto holder = scape::run_file::RunFileLock::holder(out);
  REQUIRE(holder);
  CHECK(holder->pid == pid);
  CHECK(holder->alive());
  const std::string named = "another process is writing it (pid " + std::to_string(pid) + " on host " + holder->host;
  const std::string run = "run " + (dir / "q.json").string() + " --out " + out.string() + " --quiet";
  for (const std::string& second : {run + " --resume", run, "repair " + out.string()}) {
    CAPTURE(second);
    const auto before = scape::run_file::read_run_summary(out).steps_completed;
    const auto r = run_scape(second);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(out.string() + ": " + named) != std::string::npos);
    // The live run goes on writing a file that reads.
    CHECK(wait_for([&] { return scape::run_file::read_run_summary(out).steps_completed > before + 10; }, 60));
    CHECK(scape::run_file::read_run_summary(out).status == "running");
  }
  ::kill(pid, SIGKILL);
  wait_exit(pid);
  // The killed writer's lock file still names it; the next writer takes it over and says so.
  REQUIRE(scape::run_file::RunFileLock::holder(out));
  CHECK_FALSE(scape::run_file::RunFileLock::holder(out)->alive());
  const int step = checkpoint_step(dir, out);
  const auto resumed = run_scape(run + " --resume --set steps=" + std::to_string(step + 5));
  CAPTURE(resumed.output);
  CHECK(resumed.code == 0);
  CHECK(resumed.output.find(out.string() + ".lock: took over the lock of pid " + std::to_string(pid) + " on host " +
                            holder->host + ", which ended without releasing it") != std::string::npos);
  CHECK(scape::run_file::read_run_summary(out).status == "completed");
  CHECK(scape::run_file::read_run_summary(out).steps_completed == step + 5);
  CHECK_FALSE(fs::exists(out.string() + ".lock"));  // released with the run
}

namespace {

using scape::run_file::opens_plainly;

// A long run started, then sent `signal` once it has recorded 50 steps; returns its exit status.
int signalled_run(const TempDir& dir, const fs::path& out, int signal, const std::vector<std::string>& extra) {
  scape::testing::write_text_file(dir / "q.json", kLong);
  std::vector<std::string> args = {"run", (dir / "q.json").string(), "--out", out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const pid_t pid = start_scape(args, dir / "signalled.log");
  const bool started = wait_for(
      [&] {
        try {
          return fs::exists(out) && scape::run_file::read_run_summary(out).steps_completed >= 50;
        } catch (const std::exception&) {
          return false;  // between creation and the first flush
        }
      },
      120);
  ::kill(pid, signal);
  const int code = wait_exit(pid);
  REQUIRE(started);
  return code;
}

}  // namespace

TEST_CASE("SIGTERM: the run stops at a step boundary, checkpoints, marks its file interrupted, exits 143, resumes") {
  TempDir dir;
  const fs::path out = dir / "term.h5";
  // Checkpoints are on, but none falls due: the one on disk is the signal's.
  CHECK(signalled_run(dir, out, SIGTERM, {"--checkpoint-every", "100000000"}) == 128 + SIGTERM);
  CHECK(opens_plainly(out));
  const auto s = scape::run_file::read_run_summary(out);
  CHECK(s.status == "interrupted");
  CHECK(s.steps_completed >= 50);
  const std::string n = std::to_string(s.steps_completed);
  CHECK(s.error == "SIGTERM after step " + n + "; checkpoint at step " + n + ": --resume continues");
  CHECK(scape::run_file::File::open(out, scape::run_file::Access::read).open_dataset("metrics/train_loss").dims()[0] ==
        static_cast<hsize_t>(s.steps_completed));
  CHECK(checkpoint_step(dir, out) == s.steps_completed);
  CHECK_FALSE(fs::exists(out.string() + ".lock"));
  const std::string log = read_file(dir / "signalled.log");
  CHECK(log.find("quad: interrupted after " + n + "/1000000 steps") != std::string::npos);
  CHECK(log.find("  SIGTERM after step " + n) != std::string::npos);

  const auto resumed = run_scape("run " + (dir / "q.json").string() + " --out " + out.string() +
                                 " --quiet --resume --set steps=" + std::to_string(s.steps_completed + 10));
  CAPTURE(resumed.output);
  CHECK(resumed.code == 0);
  const auto after = scape::run_file::read_run_summary(out);
  CHECK(after.status == "completed");
  CHECK(after.steps_completed == s.steps_completed + 10);
}

TEST_CASE("SIGINT without checkpoints: interrupted, exit 130, the file says it cannot be resumed") {
  TempDir dir;
  const fs::path out = dir / "int.h5";
  CHECK(signalled_run(dir, out, SIGINT, {"--quiet"}) == 128 + SIGINT);
  CHECK(opens_plainly(out));
  const auto s = scape::run_file::read_run_summary(out);
  CHECK(s.status == "interrupted");
  CHECK(s.error == "SIGINT after step " + std::to_string(s.steps_completed) +
                       "; no checkpoint (--checkpoint-every): it cannot be resumed");
  CHECK_FALSE(fs::exists(tr::checkpoint_path(out)));
}

TEST_CASE(
    "scape repair of damaged files: each ends within seconds; a failing one exits 2 and leaves the file byte for "
    "byte") {
  TempDir dir;
  const fs::path killed = dir / "killed.h5";
  killed_run(dir, killed);
  fs::remove(tr::checkpoint_path(killed));
  const std::string good = read_file(killed);
  REQUIRE(good.size() > 8192);
  // Copies with 40 bytes flipped in the first 4 KiB (superblock, root group, attributes), and cut.
  std::mt19937 rng(55);
  std::vector<std::pair<fs::path, std::string>> damaged;
  for (int i = 0; i < 12; ++i) {
    std::string bytes = good;
    for (int k = 0; k < 40; ++k) bytes[rng() % 4096] ^= static_cast<char>(1 + rng() % 255);
    damaged.emplace_back(dir / ("flip" + std::to_string(i) + ".h5"), bytes);
  }
  for (const std::size_t n : {std::size_t{100}, std::size_t{4096}, good.size() / 3})
    damaged.emplace_back(dir / ("cut" + std::to_string(n) + ".h5"), good.substr(0, n));
  damaged.emplace_back(dir / "notes.h5", "not a run file\n");
  int refused = 0;
  for (const auto& [path, bytes] : damaged) {
    std::ofstream(path, std::ios::binary) << bytes;
    const auto r = run_scape("repair " + path.string());
    CAPTURE(path);
    CAPTURE(r.output);
    CHECK(r.seconds < 10);
    CHECK((r.code == 0 || r.code == 2));
    CHECK_FALSE(fs::exists(path.string() + ".repair.tmp"));
    CHECK_FALSE(fs::exists(path.string() + ".lock"));
    if (r.code == 2) {
      ++refused;
      CHECK(read_file(path) == bytes);
      CHECK(r.output.find("error: HDF5 file '" + path.string() + "'") != std::string::npos);
      CHECK(r.output.find("the file is left unchanged") != std::string::npos);
    } else {
      CHECK(opens_plainly(path));
    }
  }
  CHECK(refused >= 10);
  // The undamaged file repairs: it opens plainly, marked killed.
  const auto r = run_scape("repair " + killed.string());
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(opens_plainly(killed));
  CHECK(scape::run_file::read_run_summary(killed).status == "killed");
}

TEST_CASE("a JSON object that names a key twice is refused with exit 2 naming the key, in configs, sweeps and --set") {
  TempDir dir;
  const std::string model = R"("model": {"type": "quadratic", "size": 200})";
  scape::testing::write_text_file(dir / "dup.json",
                                  R"({"name": "q", "workers": 2, "steps": 10, )" + model +
                                      R"(, "optimizer": {"type": "scape", "lr": 0.1, "sparsity": 0.99, "lr": 0.01}})");
  scape::testing::write_text_file(dir / "top.json",
                                  R"({"name": "q", "steps": 10, "workers": 2, "steps": 20, )" + model + "}");
  scape::testing::write_text_file(dir / "sweep.json", R"({"base": {"name": "q", "workers": 2, "steps": 10, )" + model +
                                                          R"(}, "points": [{"seed": 1}, {"seed": 2, "seed": 3}]})");
  scape::testing::write_text_file(dir / "ok.json", R"({"name": "q", "workers": 2, "steps": 10, )" + model + "}");
  const std::string dup = dir.path.string() + "/dup.json: duplicate key 'optimizer.lr'";
  for (const auto& [args, named] : std::vector<std::pair<std::string, std::string>>{
           {"validate " + (dir / "dup.json").string(), dup},
           {"run " + (dir / "dup.json").string() + " --quiet --out " + (dir / "dup.h5").string(), dup},
           {"validate " + (dir / "top.json").string(), "top.json: duplicate key 'steps'"},
           {"validate " + (dir / "sweep.json").string(), "sweep.json: duplicate key 'points[1].seed'"},
           {"validate " + (dir / "ok.json").string() + R"( --set 'model={"type": "quadratic", "size": 1, "size": 2}')",
            "duplicate key 'model.size'"}}) {
    const auto r = run_scape(args);
    CAPTURE(args);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(named) != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir / "dup.h5"));
  // The same objects without the repetition are valid.
  CHECK(run_scape("validate " + (dir / "ok.json").string()).code == 0);
  CHECK(run_scape("validate " + (dir / "ok.json").string() + R"( --set 'model={"type": "quadratic", "size": 100}')")
            .code == 0);
}

TEST_CASE("checksums: CRC-32 of each table at close; a value changed afterwards makes repair exit 2 naming the table") {
  const std::string check = "123456789";  // the CRC-32 check value of the standard
  CHECK(scape::run_file::crc32({reinterpret_cast<const unsigned char*>(check.data()), check.size()}) == 0xCBF43926u);

  TempDir dir;
  scape::testing::write_text_file(dir / "q.json", kLong);
  const fs::path out = dir / "c.h5";
  const std::string run = "run " + (dir / "q.json").string() + " --quiet --out " + out.string();
  REQUIRE(run_scape(run + " --set steps=30").code == 0);
  nlohmann::json sums;
  {
    const auto f = scape::run_file::File::open(out, scape::run_file::Access::read);
    sums = nlohmann::json::parse(f.read_string_attribute("checksums"));
    // The CRC of /metrics/step, by hand: int64 1..30, little-endian.
    std::string steps;
    for (std::int64_t s = 1; s <= 30; ++s)
      for (int b = 0; b < 8; ++b) steps.push_back(static_cast<char>((s >> (8 * b)) & 0xFF));
    CHECK(sums.at("metrics/step") ==
          scape::run_file::crc32({reinterpret_cast<const unsigned char*>(steps.data()), steps.size()}));
    CHECK(sums.contains("metrics/train_loss"));
    CHECK(sums.contains("tensors/residual_norm"));
    CHECK_FALSE(sums.contains("tensors/names"));
    CHECK(sums == scape::run_file::table_checksums(f));
  }
  // A closed file repairs as it is; one value changed by one bit does not.
  CHECK(run_scape("repair " + out.string()).code == 0);
  {
    const auto f = scape::run_file::File::open(out, scape::run_file::Access::read_write);
    const auto loss = f.open_dataset("metrics/train_loss");
    std::vector<double> v = loss.read_all<double>();
    v[7] = std::nextafter(v[7], 1e300);
    loss.write<double>({0}, {v.size()}, v);
  }
  const std::string changed = read_file(out);
  const auto r = run_scape("repair " + out.string());
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("checksum mismatch in 'metrics/train_loss'") != std::string::npos);
  CHECK(read_file(out) == changed);

  // A resumed run: its checksums are cleared while it writes, and new ones cover every row at close.
  killed_run(dir, dir / "k.h5");
  const int step = checkpoint_step(dir, dir / "k.h5");
  {
    const auto f = scape::run_file::File::open(dir / "k.h5", scape::run_file::Access::read);
    CHECK(f.read_string_attribute("checksums").empty());
  }
  CHECK(run_scape("run " + (dir / "q.json").string() + " --quiet --out " + (dir / "k.h5").string() +
                  " --resume --set steps=" + std::to_string(step + 3))
            .code == 0);
  const auto f = scape::run_file::File::open(dir / "k.h5", scape::run_file::Access::read);
  const auto after = nlohmann::json::parse(f.read_string_attribute("checksums"));
  CHECK(after == scape::run_file::table_checksums(f));
  CHECK(f.open_dataset("metrics/step").dims()[0] == static_cast<hsize_t>(step + 3));
}

TEST_CASE(
    "a run file that cannot be created leaves nothing behind and says why in words; an empty file is scape's own "
    "start") {
  TempDir dir;
  scape::testing::write_text_file(dir / "q.json", kLong);
  const fs::path out = dir / "full.h5";
  // No byte may be written to a regular file (a disk full from the start); the output goes to a
  // pipe, which the limit does not cover, and scape ignores SIGXFSZ.
  const auto full =
      scape::testing::run_command("ulimit -f 0; " + std::string(SCAPE_BINARY) + " run " + (dir / "q.json").string() +
                                  " --quiet --set steps=5 --out " + out.string());
  CAPTURE(full.output);
  CHECK(full.code == 1);
  CHECK(full.output.find("error: run file '" + out.string() +
                         "' could not be created (File too large); nothing is left behind") != std::string::npos);
  CHECK_FALSE(fs::exists(out));
  // Limits that let the file begin: HDF5 fails inside a close or a flush, and its own clean-up at
  // exit crashed on that file (exit 139 after the message) until scape ends without it.
  for (const int blocks : {1, 2, 4, 8, 16}) {
    const auto cut = scape::testing::run_command("ulimit -f " + std::to_string(blocks) + "; " + SCAPE_BINARY +
                                                 " run " + (dir / "q.json").string() +
                                                 " --quiet --set steps=5 --out " + out.string());
    CAPTURE(blocks);
    CAPTURE(cut.output);
    CHECK(cut.code == 1);
    CHECK(cut.output.find("could not be created (File too large); nothing is left behind") != std::string::npos);
    CHECK_FALSE(fs::exists(out));
  }
  // The rerun, without the limit, is not refused:
  const auto rerun = run_scape("run " + (dir / "q.json").string() + " --quiet --set steps=5 --out " + out.string());
  CHECK(rerun.code == 0);
  // An empty file where the run file goes (a creation that never wrote a byte) needs no --force.
  fs::remove(out);
  std::ofstream(out).close();
  REQUIRE(fs::file_size(out) == 0);
  const auto empty = run_scape("run " + (dir / "q.json").string() + " --quiet --set steps=5 --out " + out.string());
  CAPTURE(empty.output);
  CHECK(empty.code == 0);
  CHECK(scape::run_file::read_run_summary(out).status == "completed");
}

TEST_CASE("--resume refuses a SCAPECK1 checkpoint (no checksum) unless --allow-unchecked-checkpoint") {
  TempDir dir;
  const fs::path out = dir / "v1.h5";
  killed_run(dir, out);
  // The same checkpoint in the older format: the run id instead of the config, no checksum.
  const std::string v2 = read_file(tr::checkpoint_path(out));
  std::uint64_t json_size = 0;
  std::memcpy(&json_size, v2.data() + 8, sizeof json_size);
  const std::string body = v2.substr(16 + json_size, v2.size() - 16 - json_size - 8);
  const std::string id = cfg::run_id(cfg::parse_experiment(nlohmann::json::parse(kLong), dir.path).to_json());
  std::string v1 = "SCAPECK1";
  const std::uint64_t id_size = id.size();
  v1.append(reinterpret_cast<const char*>(&id_size), sizeof id_size);
  v1 += id + body;
  std::ofstream(tr::checkpoint_path(out), std::ios::binary | std::ios::trunc) << v1;
  const std::string resume = "run " + (dir / "q.json").string() + " --out " + out.string() + " --quiet --resume";
  auto r = run_scape(resume);
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("a checkpoint of the older SCAPECK1 format, which carries no checksum") != std::string::npos);
  CHECK(r.output.find("--allow-unchecked-checkpoint") != std::string::npos);
  // Allowed, it is read (and, as before, must be of the very config: here steps differ).
  r = run_scape(resume + " --allow-unchecked-checkpoint --set steps=999999");
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("the checkpoint belongs to another configuration (run id " + id) != std::string::npos);
  CHECK(read_file(tr::checkpoint_path(out)) == v1);
}

namespace {

std::string resume_command(const TempDir& dir, const fs::path& out, int steps) {
  return "run " + (dir / "q.json").string() + " --out " + out.string() + " --quiet --resume --set steps=" +
         std::to_string(steps);
}

bool has_final_params(const fs::path& out) {
  return scape::run_file::File::open(out, scape::run_file::Access::read).has_link("final/params");
}

}  // namespace

TEST_CASE("a run started afresh over an --out removes the checkpoint left there; --resume then has none") {
  TempDir dir;
  const fs::path out = dir / "r.h5";
  killed_run(dir, out);
  REQUIRE(fs::exists(tr::checkpoint_path(out)));
  // The fresh run (another seed, so that its file is told from the old one) replaces the file and
  // is stopped before it ends, with no checkpoint of its own.
  const pid_t pid = start_scape(
      {"run", (dir / "q.json").string(), "--out", out.string(), "--quiet", "--force", "--set", "seed=5"},
      dir / "fresh.log");
  const bool replaced = wait_for(
      [&] {
        try {
          const auto s = scape::run_file::read_run_summary(out);
          return s.config_json.find("\"seed\": 5") != std::string::npos && s.steps_completed >= 50;
        } catch (const std::exception&) {
          return false;
        }
      },
      120);
  ::kill(pid, SIGINT);
  CHECK(wait_exit(pid) == 128 + SIGINT);
  REQUIRE(replaced);
  CHECK_FALSE(fs::exists(tr::checkpoint_path(out)));
  const auto r = run_scape(resume_command(dir, out, 1000));
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(tr::checkpoint_path(out).string() + ": no checkpoint to resume from") != std::string::npos);
}

TEST_CASE("--resume refuses a run file that is not the checkpoint's run's: fewer steps, or another config") {
  TempDir dir;
  const fs::path out = dir / "r.h5";
  killed_run(dir, out);
  const int step = checkpoint_step(dir, out);
  const std::string checkpoint = read_file(tr::checkpoint_path(out));
  const std::string run = "run " + (dir / "q.json").string() + " --out " + out.string() + " --quiet --force";
  // Another run of 10 steps over the same --out (it completes, taking its own checkpoint
  // away), then the old checkpoint put back: the file holds fewer steps than it resumes after.
  REQUIRE(run_scape(run + " --set steps=10").code == 0);
  scape::testing::write_text_file(tr::checkpoint_path(out), checkpoint);
  const std::string file = read_file(out);
  auto r = run_scape(resume_command(dir, out, step + 10));
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(out.string() + ": holds steps up to 10, but the checkpoint " +
                      tr::checkpoint_path(out).string() + " resumes after step " + std::to_string(step) +
                      ": they are from different runs") != std::string::npos);
  CHECK(read_file(out) == file);
  CHECK(read_file(tr::checkpoint_path(out)) == checkpoint);
  // Enough steps, but another seed: the keys are named as --resume names a changed config.
  REQUIRE(run_scape(run + " --set seed=9 --set steps=" + std::to_string(step + 50)).code == 0);
  scape::testing::write_text_file(tr::checkpoint_path(out), checkpoint);
  r = run_scape(resume_command(dir, out, step + 10));
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(out.string() + ": --resume with a changed configuration; only steps and log.* may change, but "
                                     "these keys differ from the run file's (the run that wrote it is another): "
                                     "seed (9 -> 3)") != std::string::npos);
}

TEST_CASE("log.save_params may change on resume: the resumed run's own parameters, or none") {
  TempDir dir;
  const fs::path out = dir / "r.h5";
  // A constant learning rate (min_lr = lr), so that a run of fewer steps takes the same steps.
  const std::string constant = "optimizer.min_lr=0.01";
  killed_run(dir, out, {"--set", constant});
  nlohmann::json config = nlohmann::json::parse(kLong);
  config["optimizer"]["min_lr"] = 0.01;
  const int step = tr::load_checkpoint(cfg::parse_experiment(config, dir.path), out, 2000).step;
  // Turned on: the resumed run saves the parameters a run never stopped ends with, bit for bit.
  const auto r = run_scape(resume_command(dir, out, step + 5) + " --set " + constant + " --set log.save_params=true");
  CAPTURE(r.output);
  REQUIRE(r.code == 0);
  const fs::path straight = dir / "straight.h5";
  REQUIRE(run_scape("run " + (dir / "q.json").string() + " --out " + straight.string() + " --quiet --set steps=" +
                    std::to_string(step + 5) + " --set " + constant + " --set log.save_params=true")
              .code == 0);
  const auto read_params = [](const fs::path& f) {
    const auto file = scape::run_file::File::open(f, scape::run_file::Access::read);
    return file.open_dataset("final/params").read_all<float>();
  };
  const auto resumed = read_params(out), reference = read_params(straight);
  REQUIRE(resumed.size() == 2000);
  CHECK(resumed == reference);
  // Turned off after a run that saved them when it stopped: they go with the stopped run.
  const fs::path term = dir / "term.h5";
  const std::vector<std::string> saving = {"--quiet", "--checkpoint-every", "100000000", "--set",
                                           "log.save_params=true"};
  CHECK(signalled_run(dir, term, SIGTERM, saving) == 128 + SIGTERM);
  REQUIRE(has_final_params(term));
  const int stopped = static_cast<int>(scape::run_file::read_run_summary(term).steps_completed);
  REQUIRE(run_scape(resume_command(dir, term, stopped + 5)).code == 0);
  CHECK(scape::run_file::read_run_summary(term).status == "completed");
  CHECK_FALSE(has_final_params(term));
}

TEST_CASE("SIGTERM to scape sweep: the running point stops interrupted and opens plainly, no other starts, exit 143") {
  TempDir dir;
  scape::testing::write_text_file(dir / "s.json", R"({"base": )" + kLong + R"(, "grid": {"seed": [3, 4]}})");
  const fs::path out = dir / "out";
  const pid_t pid = start_scape({"sweep", (dir / "s.json").string(), "--out", out.string(), "--quiet"},
                                dir / "sweep.log");
  fs::path first;
  const bool running = wait_for(
      [&] {
        if (!fs::exists(out)) return false;
        for (const auto& e : fs::directory_iterator(out)) {
          if (e.path().extension() != ".h5") continue;
          try {
            if (scape::run_file::read_run_summary(e.path()).steps_completed >= 50) first = e.path();
          } catch (const std::exception&) {
          }
        }
        return !first.empty();
      },
      120);
  ::kill(pid, SIGTERM);
  CHECK(wait_exit(pid) == 128 + SIGTERM);
  REQUIRE(running);
  CHECK(opens_plainly(first));
  CHECK(scape::run_file::read_run_summary(first).status == "interrupted");
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(out)) files += e.path().extension() == ".h5";
  CHECK(files == 1);
  const std::string log = read_file(dir / "sweep.log");
  CHECK(log.find("[2/2] ") != std::string::npos);
  CHECK(log.find(": not run (SIGTERM)") != std::string::npos);
}
