// Bad input to the scape command that a review of 2026-12-07 found handled badly: each now exits 2
// naming the field, flag or file, before anything is created. A value nested 100000 levels deep
// crashed (SIGSEGV); a run name with '/' wrote outside the folder; --out naming a folder was
// "not a run file", and with --force the failed creation removed it; flags that do not apply
// were accepted; a malformed --set made every sweep point invalid (exit 1); a config with a
// stray sweep key was validated as a sweep.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "tests/test_support.hpp"

namespace fs = std::filesystem;
using scape::testing::run_scape;
using scape::testing::TempDir;
using scape::testing::write_text_file;

namespace {

const std::string kConfig = R"({"name": "ok", "steps": 3, "workers": 2, "model": {"type": "quadratic", "size": 100},
  "optimizer": {"type": "adams"}})";

// Exit 2 with `message` in the output.
void refused(const std::string& args, const std::string& message) {
  const auto r = run_scape(args);
  CAPTURE(args);
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(message) != std::string::npos);
}

}  // namespace

TEST_CASE("a value nested 100000 levels deep exits 2 naming the depth, in a config and in a sweep") {
  TempDir dir;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_text_file(dir / "d.json", R"({"steps": 2, "model": {"type": "quadratic", "size": 100}, "description": )" +
                                      deep + "}");
  refused("validate " + (dir / "d.json").string(), "d.json: nested deeper than 256 levels at 'description[0][0]");
  write_text_file(dir / "s.json", R"({"base": )" + kConfig + R"(, "points": [{"description": )" + deep + "}]}");
  refused("sweep " + (dir / "s.json").string() + " --out " + (dir / "out").string(), "nested deeper than 256 levels");
}

TEST_CASE("a run name that is not a plain file name exits 2 naming it; nothing is written") {
  TempDir dir;
  for (const std::string& name : {std::string("../esc/y"), std::string("a/b"), std::string(""), std::string("..")}) {
    std::string config = kConfig;
    config.replace(config.find("\"ok\""), 4, "\"" + name + "\"");
    write_text_file(dir / "n.json", config);
    refused("validate " + (dir / "n.json").string(), "name: ");
    refused("run " + (dir / "n.json").string() + " --quiet", "name: ");
  }
  CHECK_FALSE(fs::exists(dir.path.parent_path() / "esc"));
}

TEST_CASE("--out naming a folder, empty, or under a file exits 2 naming --out; a folder is never removed") {
  TempDir dir;
  write_text_file(dir / "ok.json", kConfig);
  const std::string run = "run " + (dir / "ok.json").string() + " --quiet --out ";
  fs::create_directories(dir / "empty-folder");
  refused(run + (dir / "empty-folder").string() + " --force", "empty-folder: names a folder; give the run file's path");
  CHECK(fs::is_directory(dir / "empty-folder"));
  refused(run + (dir / "new").string() + "/", "names a folder");
  CHECK_FALSE(fs::exists(dir / "new"));  // nothing created on exit 2
  refused(run + "''", "--out: empty; give the run file's path");
  refused(run + (dir / "ok.json").string() + "/x.h5", "cannot create its folder (Not a directory)");
}

// A bare file name has no folder to create: the check for a folder at a path that does not
// exist yet must not make it "cannot create its folder (No such file or directory)".
TEST_CASE("--out a bare file name in the working folder runs and writes it there") {
  TempDir dir;
  write_text_file(dir / "ok.json", kConfig);
  const auto r = scape::testing::run_command("cd " + dir.path.string() + " && " + std::string(SCAPE_BINARY) +
                                             " run ok.json --quiet --out bare.h5");
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(fs::is_regular_file(dir / "bare.h5"));
  // A name the file system refuses is named as --out's, exit 2 (the throwing exists() exited 1).
  refused("run " + (dir / "ok.json").string() + " --quiet --out " + std::string(300, 'x') + ".h5",
          ".h5: cannot be read (File name too long)");
}

TEST_CASE("flags that do not apply exit 2 naming the flag") {
  TempDir dir;
  write_text_file(dir / "ok.json", kConfig);
  const std::string run = "run " + (dir / "ok.json").string() + " --quiet --out " + (dir / "r.h5").string();
  refused(run + " --deterministic", "--deterministic applies to --backend mpi only");
  refused(run + " --collective-timeout 5", "--collective-timeout applies to --backend mpi and nccl");
  refused(run + " --allow-unchecked-checkpoint", "--allow-unchecked-checkpoint applies to --resume only");
  CHECK_FALSE(fs::exists(dir / "r.h5"));
  CHECK(run_scape(run).code == 0);  // the same run without them
}

TEST_CASE("scape sweep: a malformed --set or a bad --out exits 2 before any point; all points invalid exits 2") {
  TempDir dir;
  write_text_file(dir / "ok.json", kConfig);
  write_text_file(dir / "s.json", R"({"base": )" + kConfig + R"(, "grid": {"seed": [1, 2]}})");
  const std::string sweep = "sweep " + (dir / "s.json").string() + " --quiet --out ";
  refused(sweep + (dir / "a").string() + " --set optimizer..lr=1", "--set optimizer..lr=1: empty component");
  CHECK_FALSE(fs::exists(dir / "a"));
  refused(sweep + "''", "--out: empty; give the folder of the run files");
  refused(sweep + (dir / "ok.json").string(), "is a file; scape sweep writes its run files into a folder");
  write_text_file(dir / "bad.json", R"({"base": )" + kConfig + R"(, "grid": {"workers": [0, 2000]}})");
  const auto r = run_scape("sweep " + (dir / "bad.json").string() + " --quiet --out " + (dir / "b").string());
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("modelled step ms |") != std::string::npos);  // no "()" with nothing modelled
}

TEST_CASE("validate: a config with a stray sweep key is a config with an unknown key, as run says") {
  TempDir dir;
  std::string config = kConfig;
  config.insert(config.rfind('}'), R"(, "repeat": 3)");
  write_text_file(dir / "r.json", config);
  refused("validate " + (dir / "r.json").string(), "repeat: unknown key");
  refused("run " + (dir / "r.json").string() + " --quiet", "repeat: unknown key");
}

TEST_CASE("a bad value's type is named in plain words") {
  TempDir dir;
  write_text_file(dir / "t.json", R"({"steps": null, "model": {"type": "quadratic", "size": 100}})");
  refused("validate " + (dir / "t.json").string(), "steps: expected an integer, got null");
  write_text_file(dir / "a.json", R"({"steps": [1, 2], "model": {"type": "quadratic", "size": 100}})");
  refused("validate " + (dir / "a.json").string(), "steps: expected an integer, got an array [1,2]");
}

TEST_CASE("sweep files: an empty grid, a base or name of the wrong type, and a grid key's error are named as such") {
  TempDir dir;
  const std::string sweep = "validate ";
  const auto check = [&](const std::string& body, const std::string& message) {
    write_text_file(dir / "s.json", body);
    refused(sweep + (dir / "s.json").string(), message);
  };
  check(R"({"base": )" + kConfig + R"(, "grid": {}})", "sweep.grid: expected a non-empty object");
  check(R"({"base": [1], "grid": {"seed": [1]}})", "sweep.base: expected an object (a config), got an array [1]");
  check(R"({"name": 5, "base": )" + kConfig + R"(, "grid": {"seed": [1]}})", "sweep.name: expected a string, got an "
                                                                           "integer 5");
  check(R"({"base": )" + kConfig + R"(, "grid": {"optimizer..lr": [1]}})",
        "sweep.grid.optimizer..lr: empty component in key 'optimizer..lr'");
  // A key with '=' is a key (unknown), not split into key and value.
  check(R"({"base": )" + kConfig + R"(, "grid": {"optimizer.lr=x": [1]}})", "optimizer.lr=x: unknown key");
}

TEST_CASE("--set with a number beyond a double says so, not 'got a string'") {
  TempDir dir;
  write_text_file(dir / "ok.json", kConfig);
  refused("validate " + (dir / "ok.json").string() + " --set optimizer.lr=1e400",
          "--set optimizer.lr=1e400: the number 1e400 is beyond the range of a double");
}
