// The inputs the fuzz targets (fuzz/) found crashing or misbehaving, fed through the normal code
// path (config files, sweeps, traces, --set, checkpoints, run files): each is a clean error
// naming the field or file, never an exception of a library or a huge allocation. The rest of
// the hardening (unwritable files, killed runs, repair): tests/test_hardening.cpp.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>

#include "config/config.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "test_support.hpp"
#include "train/checkpoint.hpp"
#include "train/gradient_source.hpp"

namespace fs = std::filesystem;
namespace cfg = scape::config;
namespace tr = scape::train;
using scape::testing::TempDir;

using scape::testing::run_scape;
using scape::testing::write_text_file;

TEST_CASE("fuzz regressions: sweeps with a non-string base_file or a grid of millions of points are ConfigErrors") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(cfg::expand_sweep(nlohmann::json::parse(R"({"base_file": 7, "grid": {"seed": [1]}})"), dir.path),
                       "sweep.base_file: expected a file name, got an integer", cfg::ConfigError);
  // 3^20 points: refused at once rather than built until the memory runs out.
  nlohmann::json sweep = {{"base", {{"name", "x"}}}, {"grid", nlohmann::json::object()}};
  for (int k = 0; k < 20; ++k) sweep["grid"][std::string(1, 'k').append(std::to_string(k))] = {1, 2, 3};
  CHECK_THROWS_WITH_AS(cfg::expand_sweep(sweep, dir.path), doctest::Contains("more than 100000; split it"),
                       cfg::ConfigError);
  write_text_file(dir / "s.json", sweep.dump());
  const auto r = run_scape("sweep " + (dir / "s.json").string() + " --out " + (dir / "o").string());
  CHECK(r.code == 2);
  CHECK(r.output.find("more than 100000") != std::string::npos);
  // A base_file name longer than the system allows (found by CI's fuzz stage): a ConfigError
  // saying so, where std::filesystem::is_directory threw a filesystem_error.
  const nlohmann::json long_name = {{"base_file", std::string(5000, 'b') + ".json"}, {"grid", {{"seed", {1}}}}};
  CHECK_THROWS_WITH_AS(cfg::expand_sweep(long_name, dir.path),
                       doctest::Contains("cannot open the file (File name too long)"), cfg::ConfigError);
}

TEST_CASE("fuzz regression: a trace whose layout repeats a name or has a zero size is a ConfigError naming it") {
  TempDir dir;
  const auto write_trace = [&](const fs::path& p, std::vector<std::string> names, std::vector<std::int64_t> sizes) {
    const scape::run_file::File f = scape::run_file::File::create(p);
    f.create_string_dataset("layout/names", names).close();
    const hsize_t n = names.size();
    f.create_dataset("layout/sizes", H5T_STD_I64LE, {{n}, {}, {}, {}}).write<std::int64_t>({0}, {n}, sizes);
    const std::vector<std::uint8_t> decay(n, 1);
    f.create_dataset("layout/decay", H5T_STD_U8LE, {{n}, {}, {}, {}}).write<std::uint8_t>({0}, {n}, decay);
    hsize_t total = 0;
    for (auto s : sizes) total += static_cast<hsize_t>(s);
    const std::vector<float> zeros(total, 0.0f);
    f.create_dataset("init/params", H5T_IEEE_F32LE, {{total}, {}, {}, {}}).write<float>({0}, {total}, zeros);
    f.create_dataset("grads", H5T_IEEE_F32LE, {{1, 2, total}, {}, {}, {}});
  };
  const auto load = [&](const fs::path& trace) {
    const nlohmann::json j = {{"workers", 2}, {"steps", 1}, {"model", {{"type", "replay"}, {"path", trace.string()}}}};
    return scape::testing::error_of([&] { (void)tr::load_source_data(cfg::parse_experiment(j, dir.path)); });
  };
  write_trace(dir / "repeat.h5", {"w", "w"}, {2, 3});
  CHECK(load(dir / "repeat.h5") ==
        "model.path: " + (dir / "repeat.h5").string() +
            ": '/layout' is not a valid layout (ParamLayout::add: duplicate tensor name 'w')");
  write_trace(dir / "zero.h5", {"a", "b"}, {2, 0});
  CHECK(load(dir / "zero.h5").find("'b' has a zero dimension") != std::string::npos);
  write_text_file(dir / "t.json", R"({"workers": 2, "steps": 1, "model": {"type": "replay", "path": "repeat.h5"}})");
  const auto run = run_scape("run " + (dir / "t.json").string() + " --out " + (dir / "t.h5").string());
  CHECK(run.code == 2);
  CHECK(run.output.find("duplicate tensor name 'w'") != std::string::npos);
}

TEST_CASE("fuzz regression: --resume on a run file whose step table cannot grow is an H5Error naming it") {
  TempDir dir;
  scape::run_file::RunFileSpec spec;
  spec.metric_names = {"a"};
  {
    auto recorder = scape::run_file::RunRecorder::create(dir / "r.h5", spec);
    recorder.close();
  }
  {
    // Replace /metrics/step by a contiguous (fixed-size) table, as a foreign writer might.
    const scape::run_file::File f = scape::run_file::File::open(dir / "r.h5", scape::run_file::Access::read_write);
    const auto lock = scape::run_file::lock_hdf5();
    H5Ldelete(f.id(), "metrics/step", H5P_DEFAULT);
    f.create_dataset("metrics/step", H5T_STD_I64LE, {{0}, {}, {}, {}}).close();
  }
  CHECK_THROWS_WITH_AS(scape::run_file::RunRecorder::open_for_resume(dir / "r.h5", spec, 0),
                       doctest::Contains("'/metrics/step' cannot grow (not chunked)"), scape::run_file::H5Error);
}

TEST_CASE("fuzz regression (set_override): a --set value that is not UTF-8 is a ConfigError, not a JSON exception") {
  TempDir dir;
  // The input libFuzzer saved (fuzz_set_override), two of its lines.
  nlohmann::json j = {{"model", {{"type", "quadratic"}}}};
  CHECK_THROWS_WITH_AS(cfg::apply_override(j, "optimizer.betas=[0.9,0\xff\xff\xff.95]"),
                       doctest::Contains(": not valid UTF-8"), cfg::ConfigError);
  CHECK_THROWS_WITH_AS(cfg::apply_override(j, "na\xffme=x"), doctest::Contains(": not valid UTF-8"), cfg::ConfigError);
  write_text_file(dir / "q.json", scape::testing::quadratic_scape_config(4000));
  const auto r = run_scape("validate " + (dir / "q.json").string() + " --set optimizer.type=$(printf '\\377')");
  CHECK(r.code == 2);
  CHECK(r.output.find("not valid UTF-8") != std::string::npos);
}

TEST_CASE(
    "fuzz regression (checkpoint): numbers beyond double in a checkpoint's config or a config file are ConfigErrors") {
  TempDir dir;
  const auto config = cfg::parse_experiment(nlohmann::json{{"name", "ck"},
                                                           {"workers", 2},
                                                           {"steps", 10},
                                                           {"model", {{"type", "quadratic"}, {"size", 64}}},
                                                           {"optimizer", {{"type", "adams"}}}},
                                            dir.path);
  // The crashing input fuzz_checkpoint saved: a SCAPECK2 checkpoint whose (checksummed) config
  // holds 4.9999999999999995e99999999995, which nlohmann reports as out_of_range, not parse_error.
  const auto run_file = dir / "run.h5";
  std::ofstream(tr::checkpoint_path(run_file), std::ios::binary)
      << tr::encode_checkpoint(R"({"seed": 4.9999999999999995e99999999995})", 4, {{}, {}}, std::vector<float>(3));
  CHECK_THROWS_WITH_AS(tr::load_checkpoint(config, run_file, 3),
                       doctest::Contains("corrupt checkpoint (its config is not JSON)"), cfg::ConfigError);
  // The same number in a config file, and in a --set value (read as a string until 2026-12-07,
  // now refused saying so).
  write_text_file(dir / "big.json", R"({"name": "x", "seed": 1e999})");
  CHECK_THROWS_WITH_AS(cfg::read_json_file(dir / "big.json"), doctest::Contains("big.json: invalid JSON"),
                       cfg::ConfigError);
  nlohmann::json j = {{"optimizer", {{"type", "adamw"}}}};
  CHECK_THROWS_WITH_AS(cfg::apply_override(j, "optimizer.lr=1e999"),
                       doctest::Contains("the number 1e999 is beyond the range of a double"), cfg::ConfigError);
  const auto r = run_scape("validate " + (dir / "big.json").string());
  CHECK(r.code == 2);
}

TEST_CASE(
    "fuzz regressions (trace, run_file): corrupt extents and attribute shapes are clean errors, not huge allocations") {
  TempDir dir;
  // fuzz_trace: '/layout/names' claiming 2^32 strings in a tiny file (chunked, nothing stored).
  {
    const scape::run_file::File f = scape::run_file::File::create(dir / "t.h5");
    f.create_dataset("layout/names", H5T_STD_I64LE, {{hsize_t{1} << 32}, {}, {1024}, {}}).close();
  }
  const nlohmann::json replay = {
      {"workers", 2}, {"steps", 1}, {"model", {{"type", "replay"}, {"path", (dir / "t.h5").string()}}}};
  CHECK(scape::testing::error_of([&] { (void)tr::load_source_data(cfg::parse_experiment(replay, dir.path)); }) ==
        "model.path: HDF5 file '" + (dir / "t.h5").string() +
            "': '/layout/names' holds 4294967296 strings, more than the 1048576 it may");

  scape::run_file::RunFileSpec spec;
  spec.metric_names = {"a"};
  const auto fresh = [&](const fs::path& p) {
    auto recorder = scape::run_file::RunRecorder::create(p, spec);
    const double row[1] = {1.0};
    recorder.append_step(1, row);
    recorder.close();
  };
  // fuzz_run_file: a 'status' attribute holding two strings made H5Awrite read past the one
  // value it was given (ASan: stack-buffer-overflow) when --resume rewrote it.
  fresh(dir / "a.h5");
  {
    const scape::run_file::File f = scape::run_file::File::open(dir / "a.h5", scape::run_file::Access::read_write);
    const auto lock = scape::run_file::lock_hdf5();
    H5Adelete(f.id(), "status");
    const hsize_t two = 2;
    const hid_t space = H5Screate_simple(1, &two, nullptr);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    const char* values[2] = {"running", "running"};
    const hid_t attr = H5Acreate2(f.id(), "status", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, values);
    H5Aclose(attr);
    H5Tclose(type);
    H5Sclose(space);
  }
  CHECK_THROWS_WITH_AS(scape::run_file::RunRecorder::open_for_resume(dir / "a.h5", spec, 1),
                       doctest::Contains("attribute 'status' of '/' is not a single string"), scape::run_file::H5Error);
  // A step table claiming 2^40 rows: refused before its rows are allocated (resume and repair).
  fresh(dir / "b.h5");
  {
    const scape::run_file::File f = scape::run_file::File::open(dir / "b.h5", scape::run_file::Access::read_write);
    f.open_dataset("metrics/step").set_extent({hsize_t{1} << 40});
  }
  CHECK_THROWS_WITH_AS(scape::run_file::RunRecorder::open_for_resume(dir / "b.h5", spec, 1),
                       doctest::Contains("'/metrics/step' is not a 1-D table of the file's steps"),
                       scape::run_file::H5Error);
  CHECK_THROWS_WITH_AS(scape::run_file::repair_run_file(dir / "b.h5"),
                       doctest::Contains("is not a 1-D table of the file's steps"), scape::run_file::H5Error);
}
