// Sweeps into one folder at the same time (apps/command_sweep.cpp, run_file/run_lock.hpp):
// every point trains once, each sweep's table still reports every point, and a point another
// sweep holds is waited for and then read back from the file that sweep wrote; parallel points
// print whole, labelled progress lines.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "run_file/recorder.hpp"
#include "run_file/run_lock.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

using scape::testing::run_scape;
using scape::testing::TempDir;
using scape::testing::write_text_file;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t pos = 0; (pos = text.find(what, pos)) != std::string::npos; ++pos) ++n;
  return n;
}

// The run id `scape validate` prints for the point whose label holds `label`.
std::string run_id_of(const std::string& validate_output, const std::string& label) {
  const std::regex line(label + R"([^\n]*\(run id ([0-9a-f]+)\))");
  std::smatch m;
  REQUIRE(std::regex_search(validate_output, m, line));
  return m[1];
}

bool completed(const fs::path& file) {
  try {
    return fs::exists(file) && scape::run_file::read_run_summary(file).status == "completed";
  } catch (const std::exception&) {
    return false;  // still being written
  }
}

}  // namespace

TEST_CASE("two sweeps into one folder run every point once, and both report every point") {
  TempDir dir;
  // Six points of a few tenths of a second each, both sweeps started at once: each plans all six
  // before the other finishes one, so without the lock every point would train twice.
  write_text_file(dir.path / "s.json", R"({
    "base": {"name": "two", "workers": 4, "steps": 80, "model": {"type": "quadratic", "size": 100000},
             "optimizer": {"type": "scape", "sparsity": 0.9}},
    "lr_search": [0.001, 0.002, 0.003, 0.004, 0.005, 0.006]
  })");
  const std::string cmd = "sweep " + (dir.path / "s.json").string() + " --out " + (dir.path / "out").string() + " --jobs 2 --quiet";
  scape::testing::CommandResult a, b;
  std::thread first([&] { a = run_scape(cmd); });
  std::thread second([&] { b = run_scape(cmd); });
  first.join();
  second.join();
  CAPTURE(a.output);
  CAPTURE(b.output);
  CHECK(a.code == 0);
  CHECK(b.code == 0);
  // Each point's training ran in exactly one of the two processes...
  CHECK(count(a.output, ": completed\n") + count(b.output, ": completed\n") == 6);
  // ...and each table has a row with figures for every point.
  for (const auto* out : {&a.output, &b.output}) {
    CHECK(count(*out, "| completed | ") + count(*out, "| skipped (completed") == 6);
  }
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path / "out")) {
    CHECK(e.path().extension() == ".h5");  // no lock file left behind
    if (e.path().extension() == ".h5") {
      ++files;
      CHECK(scape::run_file::read_run_summary(e.path()).status == "completed");
    }
  }
  CHECK(files == 6);
}

TEST_CASE("a point another sweep holds is waited for, then reported from the file that sweep wrote") {
  TempDir dir;
  const std::string base = R"("name": "held", "workers": 2, "steps": 20, "model": {"type": "quadratic", "size": 3000},
             "optimizer": {"type": "scape", "sparsity": 0.9)";
  write_text_file(dir.path / "s.json", "{\"base\": {" + base + "}}, \"lr_search\": [0.001, 0.002]}");
  const auto validated = run_scape("validate " + (dir.path / "s.json").string());
  REQUIRE(validated.code == 0);
  const auto out = dir.path / "out";
  fs::create_directories(out);
  const auto held = out / ("held-" + run_id_of(validated.output, "optimizer.lr=0.001") + ".h5");
  const auto other = out / ("held-" + run_id_of(validated.output, "optimizer.lr=0.002") + ".h5");
  auto lock = scape::run_file::RunFileLock::try_acquire(held);  // this test plays the other sweep
  REQUIRE(lock.has_value());

  scape::testing::CommandResult r;
  std::thread sweep([&] { r = run_scape("sweep " + (dir.path / "s.json").string() + " --out " + out.string() + " --quiet"); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (!completed(other) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(completed(other));
  // The other sweep finishes the held point (the same config), then lets go of it. A `scape run`
  // into the held file itself is refused (one writer per file), so the run goes elsewhere and
  // its file is moved into place while the lock is held.
  write_text_file(dir.path / "p.json", "{" + base + ", \"lr\": 0.001}, \"seed\": 1}");
  const auto refused = run_scape("run " + (dir.path / "p.json").string() + " --out " + held.string() + " --quiet");
  CHECK(refused.code == 2);
  CHECK(refused.output.find(held.string() + ": another process is writing it (pid " + std::to_string(::getpid())) !=
        std::string::npos);
  const auto elsewhere = dir.path / "elsewhere.h5";
  const auto ran = run_scape("run " + (dir.path / "p.json").string() + " --out " + elsewhere.string() + " --quiet");
  CAPTURE(ran.output);
  REQUIRE(ran.code == 0);
  fs::rename(elsewhere, held);
  const auto written = fs::last_write_time(held);
  lock.reset();
  sweep.join();
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("optimizer.lr=0.001: another sweep is running it; waiting for it at the end") !=
        std::string::npos);
  CHECK(r.output.find("optimizer.lr=0.001: waiting for another sweep's run of it") != std::string::npos);
  CHECK(r.output.find("| optimizer.lr=0.001 | skipped (completed by another sweep) |") != std::string::npos);
  CHECK(count(r.output, ": completed\n") == 1);  // only the free point trained in this sweep
  CHECK(fs::last_write_time(held) == written);     // neither run again nor overwritten
  CHECK_FALSE(fs::exists(held.string() + ".lock"));
}

TEST_CASE("parallel points each print whole progress lines that name the point") {
  TempDir dir;
  write_text_file(dir.path / "s.json", R"({
    "base": {"name": "progress", "workers": 2, "steps": 30, "model": {"type": "quadratic", "size": 3000},
             "optimizer": {"type": "scape", "sparsity": 0.9}},
    "lr_search": [0.001, 0.002]
  })");
  const auto r = run_scape("sweep " + (dir.path / "s.json").string() + " --out " + (dir.path / "out").string() + " --jobs 2");
  CAPTURE(r.output);
  REQUIRE(r.code == 0);
  // Each point's last line starts a line of its own, whatever the other point printed meanwhile.
  for (const char* point : {"[1/2] optimizer.lr=0.001", "[2/2] optimizer.lr=0.002"}) {
    const std::string last = std::string("\n") + point + ": step 30/30  loss ";
    CHECK(count(r.output, last) == 1);
  }
  // Once a minute with parallel points: the first step's line and the last, not one per 2 s.
  CHECK(count(r.output, ": step ") == 4);
  const auto quiet = run_scape("sweep " + (dir.path / "s.json").string() + " --out " + (dir.path / "q").string() +
                               " --jobs 2 --quiet");
  REQUIRE(quiet.code == 0);
  CHECK(count(quiet.output, ": step ") == 0);
}
