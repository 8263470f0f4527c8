// End-to-end tests of `scape run` / `scape sweep` / `scape validate`: HDF5 metrics against the
// closed forms and ranges, bad configs (exit 2, message naming the problem), divergence
// (exit 3, metrics kept), SIGKILL leaving a readable file, resume bit for bit. `scape sweep` and
// replay: tests/test_harness_sweep.cpp.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "core/schedule.hpp"
#include "harness_fixtures.hpp"
#include "kernels/backend.hpp"
#include "optimizers/scape/mask_ownership.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

using scape::testing::run_scape;
using scape::testing::TempDir;
using namespace scape::testing::harness;

TEST_CASE("scape run: bytes_sent splits into intra- and inter-node bytes by the group each collective spans") {
  TempDir dir;
  write_file(dir.path / "g.json", kTinyGpt);
  const auto run = [&](const std::string& name, const std::string& sets) {
    const auto r =
        run_scape("run " + (dir.path / "g.json").string() + " --out " + (dir.path / name).string() + " --quiet" + sets);
    CAPTURE(r.output);
    CHECK(r.code == 0);
    return std::array{read_metric(dir.path / name, "bytes_sent"), read_metric(dir.path / name, "bytes_sent_intra"),
                      read_metric(dir.path / name, "bytes_sent_inter")};
  };
  // Flat on nodes of one rank: every byte crosses the network.
  const auto flat = run("flat.h5", "");
  // Both workers on one node: the same collectives, all inside the node.
  const auto one_node = run("one_node.h5", " --set topology.ranks_per_node=2 --set network.intra=nvlink_h100");
  // Hierarchical on one node of two ranks: the node's reduce-scatter and all-gather of 4 N bytes
  // (half each sent), and rails of one node that send nothing.
  const auto hier = run("hier.h5", " --set topology.ranks_per_node=2 --set optimizer.hierarchy=node");
  REQUIRE(flat[0].size() == 6);
  const auto params = scape::run_file::File::open(dir.path / "flat.h5", scape::run_file::Access::read)
                          .open_dataset("/final/params")
                          .dims()
                          .front();
  for (std::size_t t = 0; t < 6; ++t) {
    CHECK(flat[0][t] > 0);
    CHECK(flat[1][t] == 0);
    CHECK(flat[2][t] == flat[0][t]);
    CHECK(one_node[1][t] == flat[0][t]);
    CHECK(one_node[2][t] == 0);
    CHECK(hier[1][t] == 4.0 * static_cast<double>(params));
    CHECK(hier[2][t] == 0);
    CHECK(hier[0][t] == hier[1][t]);
  }
}

TEST_CASE("scape run: the run file's bytes equal the closed forms; densities and Jaccard lie in range") {
  TempDir dir;
  const auto r = run_config(dir, "q", kQuadratic);
  CHECK(r.code == 0);
  CAPTURE(r.output);
  const auto summary = scape::run_file::read_run_summary(dir.path / "q.h5");
  CHECK(summary.status == "completed");
  CHECK(summary.steps_completed == 12);
  const std::size_t n = 5000, w = 4;
  // Shards of 64 ceil(5000 / 256) = 1280; the quadratic's one tensor has one fragment in each,
  // of k = max(1, floor(0.01 |S_w|)) bits (mask_scope = tensor).
  std::size_t k = 0;
  for (std::size_t s : {1280u, 1280u, 1280u, 1160u}) k += scape::k_tensor_piece(1.0 - 0.99, s);
  const double fraction = (w - 1.0) / w;
  const auto rs = read_metric(dir.path / "q.h5", "bytes_sent_grad_reduce_scatter");
  const auto ag = read_metric(dir.path / "q.h5", "bytes_sent_param_all_gather");
  const auto mask = read_metric(dir.path / "q.h5", "bytes_sent_mask_all_gather");
  const auto total = read_metric(dir.path / "q.h5", "bytes_sent");
  const auto steps = scape::run_file::File::open(dir.path / "q.h5", scape::run_file::Access::read).open_dataset("/metrics/step").read_all<std::int64_t>();
  REQUIRE(rs.size() == 12);
  CHECK(steps.front() == 1);
  CHECK(steps.back() == 12);
  // The default Elias-Fano mask: per shard 8 ceil((k L + k + floor((|S_w| - 1) / 2^L)) / 64)
  // bytes, L = floor(log2(|S_w| / k_w)): k_w = 13 (L = 6, 13 6 + 13 + 19 = 110 bits, 2 words)
  // for the three shards of 1280 and k_w = 12 (L = 6, 72 + 12 + 18 = 102 bits, 2 words) for 1160.
  REQUIRE(3 * 1280 + 1160 == n);
  const double mask_bytes = 8.0 * (2 + 2 + 2 + 2);
  for (std::size_t t = 0; t < 12; ++t) {
    CHECK(rs[t] == doctest::Approx(fraction * 4.0 * k));
    CHECK(ag[t] == doctest::Approx(fraction * 4.0 * k));
    const double masks = t == 0 ? 2 : (t == 11 ? 0 : 1);
    CHECK(mask[t] == doctest::Approx(masks * fraction * mask_bytes));
    CHECK(total[t] == doctest::Approx(rs[t] + ag[t] + mask[t]));
  }
  for (const char* name : {"mask_jaccard", "mask_density"}) {
    const auto v = read_metric(dir.path / "q.h5", name);
    for (std::size_t t = 1; t < v.size(); ++t) {
      CHECK(v[t] >= 0.0);
      CHECK(v[t] <= 1.0);
    }
  }
  // The oracles are defined for the earlier formulation only (test_mask_oracle checks them).
  for (const char* name : {"mask_oracle_overlap", "mask_energy_capture"}) {
    for (const double x : read_metric(dir.path / "q.h5", name)) CHECK(std::isnan(x));
  }
  CHECK(std::isnan(read_metric(dir.path / "q.h5", "mask_jaccard")[0]));
  CHECK(read_metric(dir.path / "q.h5", "mask_density")[5] == doctest::Approx(static_cast<double>(k) / n));
  // Under lag 1 the second mask is computed from the same statistic as the first.
  CHECK(read_metric(dir.path / "q.h5", "mask_jaccard")[1] == 1.0);
  // alpha-beta: reduce-scatter of 4k bytes on 4 workers = 3 alpha + 0.75 * 4k / B.
  const auto exposed = read_metric(dir.path / "q.h5", "comm_time_exposed");
  CHECK(exposed[5] == doctest::Approx(2 * (3 * 2e-6 + fraction * 4.0 * k / 1e10)));
}

TEST_CASE("scape run on a Llama: it trains; bad shapes exit 2 naming the key") {
  TempDir dir;
  std::string cfg = kTinyGpt;
  const std::string gpt = "\"type\": \"gpt\",";
  cfg.replace(cfg.find(gpt), gpt.size(), "\"type\": \"llama\", \"n_kv_head\": 1,");
  auto r = run_config(dir, "l", cfg);
  CAPTURE(r.output);
  CHECK(r.code == 0);
  const auto loss = read_metric(dir.path / "l.h5", "train_loss");
  REQUIRE(loss.size() == 6);
  CHECK(loss[0] == doctest::Approx(std::log(32.0)).epsilon(0.05));
  CHECK(loss[5] < loss[0]);
  const std::pair<const char*, const char*> bad[] = {
      {"model.n_embd=17", "model.n_head"}, {"model.n_embd=6", "model.n_embd"}, {"model.n_kv_head=3", "model.n_kv_head"}};
  for (const auto& [set, key] : bad) {
    r = run_scape("run " + (dir.path / "l.json").string() + " --out " + (dir.path / "x.h5").string() + " --quiet --set " + set);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(key) != std::string::npos);
  }
}

TEST_CASE("scape run on a GPT: validation, final parameters and dense metrics as NaN") {
  TempDir dir;
  auto r = run_config(dir, "g", kTinyGpt);
  CHECK(r.code == 0);
  auto f = scape::run_file::File::open(dir.path / "g.h5", scape::run_file::Access::read);
  CHECK(f.open_dataset("/eval/step").read_all<std::int64_t>() == std::vector<std::int64_t>{3, 6});
  const auto val = f.open_dataset("/eval/val_loss").read_all<double>();
  CHECK(val[0] < std::log(32.0) + 0.3);
  CHECK(f.open_dataset("/final/params").read_all<float>().size() > 1000);
  const auto loss = read_metric(dir.path / "g.h5", "train_loss");
  CHECK(loss[0] == doctest::Approx(std::log(32.0)).epsilon(0.05));
  r = run_scape("run " + (dir.path / "g.json").string() + " --out " + (dir.path / "d.h5").string() +
            " --quiet --set optimizer.type=adams");
  CHECK(r.code == 0);
  CHECK(std::isnan(read_metric(dir.path / "d.h5", "mask_density")[2]));
  CHECK(std::isnan(read_metric(dir.path / "d.h5", "residual_norm")[2]));
}

TEST_CASE("overlap_grad_reduce: bit-identical training, the same bytes in L + 2 buckets, the backward hides them") {
  TempDir dir;
  write_file(dir.path / "g.json", kTinyGpt);
  // A link and a (FLOP-modelled, MFU 1e-7) compute of about a millisecond each, so that the
  // buckets both hide in part and leave a tail; 1 layer: three buckets (final LayerNorm,
  // block 0, embeddings).
  const std::string common = " --quiet --set network.alpha_us=1 --set network.bandwidth_GBps=0.01"
                             " --set compute.type=flops --set compute.mfu=1e-7";
  for (const char* type : {"adamw", "adams"}) {
    CAPTURE(type);
    const fs::path off = dir.path / (std::string(type) + "-off.h5"), on = dir.path / (std::string(type) + "-on.h5");
    const std::string set = " --set optimizer.type=" + std::string(type);
    REQUIRE(run_scape("run " + (dir.path / "g.json").string() + " --out " + off.string() + common + set).code == 0);
    const auto r = run_scape("run " + (dir.path / "g.json").string() + " --out " + on.string() + common + set +
                             " --set optimizer.overlap_grad_reduce=true");
    CAPTURE(r.output);
    REQUIRE(r.code == 0);
    auto final_params = [](const fs::path& p) {
      return scape::run_file::File::open(p, scape::run_file::Access::read).open_dataset("/final/params").read_all<float>();
    };
    const auto a = final_params(off), b = final_params(on);
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    CHECK(read_metric(off, "train_loss") == read_metric(on, "train_loss"));
    const auto bytes_off = read_metric(off, "bytes_sent_grad_reduce_scatter");
    const auto bytes_on = read_metric(on, "bytes_sent_grad_reduce_scatter");
    const auto model_off = read_metric(off, "comm_time_model"), model_on = read_metric(on, "comm_time_model");
    const auto exposed_off = read_metric(off, "comm_time_exposed"), exposed_on = read_metric(on, "comm_time_exposed");
    const auto step_off = read_metric(off, "step_time_model"), step_on = read_metric(on, "step_time_model");
    const auto compute = read_metric(on, "compute_time_model");
    REQUIRE(bytes_on.size() == 6);
    // Ring closed forms at W = 2 (alpha 1 us, 1e7 B/s): a reduce-scatter of N fp32 values takes
    // alpha + (N / 2) 4 / 1e7 s; the last bucket, the embeddings (32 + 16 rows of 16), alpha +
    // (768 / 2) 4 / 1e7 s.
    const double alpha = 1e-6, n = static_cast<double>(a.size());
    const double reduce_scatter = alpha + n / 2 * 4 / 1e7, last_bucket = alpha + 768.0 / 2 * 4 / 1e7;
    for (std::size_t i = 0; i < bytes_on.size(); ++i) {
      CAPTURE(i);
      CHECK(bytes_on[i] == doctest::Approx(bytes_off[i]).epsilon(1e-12));
      // Three reduce-scatters of W - 1 = 1 latency step each instead of one: two more alphas.
      CHECK(model_on[i] == doctest::Approx(model_off[i] + 2 * alpha).epsilon(1e-12));
      // Off, everything blocks; on, only the parameter all-gather does, and the buckets' tail
      // goes into the step: at least the last bucket, less than all of them.
      CHECK(exposed_off[i] == doctest::Approx(model_off[i]).epsilon(1e-12));
      CHECK(exposed_on[i] == doctest::Approx(model_off[i] - reduce_scatter).epsilon(1e-9));
      CHECK(step_off[i] == doctest::Approx(compute[i] + model_off[i]).epsilon(1e-12));
      CHECK(step_on[i] >= compute[i] + exposed_on[i] + last_bucket * (1 - 1e-12));
      CHECK(step_on[i] < step_off[i]);
    }
  }
}

TEST_CASE("scape --version names the commit it was built from, the one checked out") {
  const auto head = scape::testing::run_command("git -C " + std::string(SCAPE_SOURCE_DIR) + " rev-parse --short=12 HEAD");
  if (head.code != 0 || head.output.size() < 12) {
    MESSAGE("skipped: the source folder is not a git checkout");
    return;
  }
  const auto r = run_scape("--version");
  CAPTURE(r.output);
  CHECK(r.code == 0);
  // The commit, not the dirty flag: editing a file after the build must not fail this test.
  CHECK(r.output.find("(" + head.output.substr(0, 12)) != std::string::npos);
}

TEST_CASE("every verb of the dispatch table answers --help, and scape lists them all") {
  // apps/scape_main.cpp's table: a verb left out of it (or renamed) fails here.
  const std::vector<std::string> verbs = {"run", "sweep", "validate", "repair", "schema", "predict", "bench-comm"};
  const auto top = run_scape("--help");
  CHECK(top.code == 0);
  for (const auto& verb : verbs) {
    CAPTURE(verb);
    CHECK(top.output.find("  " + verb) != std::string::npos);
    const auto r = run_scape(verb + " --help");
    CHECK(r.code == 0);
    CHECK(r.output.find(verb) != std::string::npos);
  }
  // No verb, or an unknown one: CLI11's usage error.
  CHECK(run_scape("").code != 0);
  CHECK(run_scape("bogus").code != 0);
}

TEST_CASE("bad configurations exit 2 with a message naming the problem") {
  TempDir dir;
  write_file(dir.path / "corrupt.bin", std::string("\x01\x02\x03", 3));
  write_file(dir.path / "bad.json", "{\"workers\": 2,,}");
  struct Case {
    std::string set;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"optimizer.sparsty=0.9", "optimizer.sparsty: unknown key (did you mean 'sparsity'?)"},
      {"workers=\\\"four\\\"", "workers: expected an integer"},
      {"optimizer.sparsity=1.5", "optimizer.sparsity: 1.5 is out of range"},
      {"workers=0", "workers: 0 is out of range"},
      {"optimizer.type=sgd", "optimizer.type: unknown value \"sgd\""},
      {"model.n_head=3", "model.n_head: 3 does not divide model.n_embd"},
      {"optimizer.betas=[0.9]", "optimizer.betas: expected [beta1, beta2]"},
      {"network.preset=infiniband", "network.preset: unknown network preset 'infiniband'"},
      {"optimizer.mask_partition=local_union", "set optimizer.sharded = false"},
      {"model.path=x.h5", "model.path: only valid for model.type \"replay\""},
      {"optimizer.lr=-1", "optimizer.lr: -1"},
      {"eval.interval=0", "eval.interval: 0 is out of range"},
      {"optimizer.device=gpu", "optimizer.device: unknown value \"gpu\""},
      {"optimizer.offload_chunk=12", "optimizer.offload_chunk: 12 is out of range"},
      {"optimizer.residual_decay=1.5", "optimizer.residual_decay: 1.5 is out of range"},
      {"optimizer.residual_decay=-0.1", "optimizer.residual_decay: -0.1 is out of range"},
      {"optimizer.residual_clip=-1", "optimizer.residual_clip: -1 is out of range"},
      {"optimizer.type=adamw --set optimizer.device=cuda", "optimizer.device: placing the optimizer alone on the GPU"},
      {"device=tpu", "device: unknown value \"tpu\""},
      {"model.precision=fp16", "model.precision: unknown value \"fp16\""},
      {"device=cuda --set optimizer.device=cpu", "optimizer.device: \"cpu\" cannot step parameters that live on the GPU"},
      {"device=cuda --set optimizer.type=topk_ef", "device: \"cuda\" runs the optimizer types scape, adamw and adams"},
      // The formulation's keys.
      {"optimizer.formulation=paperr", "optimizer.formulation: unknown value \"paperr\""},
      {"optimizer.mask_scope=layer", "optimizer.mask_scope: unknown value \"layer\""},
      {"optimizer.adams_form=adam", "optimizer.adams_form: unknown value \"adam\""},
      {"optimizer.clip_grad=-1", "optimizer.clip_grad: -1 is out of range"},
      {"optimizer.density_start=0", "optimizer.density_start: 0 is out of range"},
      {"optimizer.density_start=1.5", "optimizer.density_start: 1.5 is out of range"},
      {"optimizer.dense_tensors=\\\"norm\\\"", "optimizer.dense_tensors: expected an array of strings"},
      {"optimizer.dense_tensors=[1]", "optimizer.dense_tensors[0]: expected a non-empty string"},
      {"optimizer.type=adams --set optimizer.wire_dtype=fp8_e5m2", "optimizer.wire_dtype: fp8_e5m2 is SCAPE's payload"},
      {"optimizer.wire_dtype=fp8_e5m2", "optimizer.wire_dtype: fp8_e5m2 is implemented for replicated state"},
      {"optimizer.update=dense", "optimizer.update: dense steps m off the mask"},
      {"optimizer.mask_scope=shard --set optimizer.dense_tensors=[\\\"norm\\\"]", "optimizer.dense_tensors: mask_scope = shard"},
      {"optimizer.density_warmup=5 --set optimizer.density_cooldown=5", "optimizer.density_cooldown: the cool-down replaces"},
      {"optimizer.type=demo --set optimizer.sharded=false --set optimizer.clip_grad=1", "optimizer.clip_grad: demo never forms"},
      // DiLoCo and SparseLoCo.
      {"optimizer.type=diloco --set optimizer.inner_steps=0", "optimizer.inner_steps: 0 is out of range"},
      {"optimizer.type=diloco --set optimizer.outer_lr=0", "optimizer.outer_lr: 0 is out of range"},
      {"optimizer.type=diloco --set optimizer.outer_momentum=1", "optimizer.outer_momentum: 1 is out of range"},
      {"optimizer.type=diloco --set optimizer.outer_wire=fp16", "optimizer.outer_wire: unknown value \"fp16\""},
      {"optimizer.type=diloco --set optimizer.inner_steps=6 --set optimizer.streaming_fragments=7",
       "optimizer.streaming_fragments: 7 is more than optimizer.inner_steps = 6"},
      {"optimizer.type=diloco --set optimizer.sharded=true", "optimizer.sharded: diloco keeps replicated optimizer state"},
      {"optimizer.type=diloco --set optimizer.clip_grad=1", "optimizer.clip_grad: diloco never forms"},
      {"optimizer.type=sparseloco --set optimizer.sparsity=1", "optimizer.sparsity: 1 is out of range"},
      {"optimizer.type=sparseloco --set optimizer.quant_bits=3", "optimizer.quant_bits: 3 is out of range"},
      {"optimizer.type=sparseloco --set optimizer.chunk=0", "optimizer.chunk: 0 is out of range"},
      {"optimizer.type=sparseloco --set optimizer.ef_decay=1.5", "optimizer.ef_decay: 1.5 is out of range"},
      {"optimizer.type=sparseloco --set optimizer.mask_encoding=delta", "optimizer.mask_encoding: delta codes a mask"},
      // The node hierarchy.
      {"topology.ranks_per_node=3", "topology.ranks_per_node: 3 does not divide workers = 2"},
      {"topology.ranks_per_node=0", "topology.ranks_per_node: 0 is out of range"},
      {"optimizer.hierarchy=rack", "optimizer.hierarchy: unknown value \"rack\""},
      {"network.intra=nvswitch", "network.intra: unknown network preset 'nvswitch'"},
      {"optimizer.type=topk_ef --set optimizer.sharded=false --set optimizer.hierarchy=node",
       "optimizer.hierarchy: \"node\" is built for scape, adams and diloco, not topk_ef"},
      {"optimizer.rail_split=rows", "optimizer.rail_split: splits the layout among a node's rails"},
      {"optimizer.hierarchy=node --set optimizer.clip_grad=1", "optimizer.clip_grad: under optimizer.hierarchy"},
  };
  write_file(dir.path / "g.json", kTinyGpt);
  for (const auto& c : cases) {
    CAPTURE(c.set);
    const auto r = run_scape("run " + (dir.path / "g.json").string() + " --out " + (dir.path / "x.h5").string() +
                         " --quiet --set " + c.set);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(c.needle) != std::string::npos);
    CHECK_FALSE(fs::exists(dir.path / "x.h5"));
  }
  // Refused with exit 2 and a message holding `needle` (and not `absent`), nothing written.
  const auto refused = [&](const char* file, const std::string& set, const std::string& needle,
                           const std::string& absent = "") {
    CAPTURE(set);
    const auto r = run_scape("run " + (dir.path / file).string() + " --out " + (dir.path / "x.h5").string() +
                             " --quiet --set " + set);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(needle) != std::string::npos);
    if (!absent.empty()) CHECK(r.output.find(absent) == std::string::npos);
    CHECK_FALSE(fs::exists(dir.path / "x.h5"));
  };
  // scape validate refuses the same, naming both keys.
  const auto topology = run_scape("validate " + (dir.path / "g.json").string() + " --set topology.ranks_per_node=4");
  CHECK(topology.code == 2);
  CHECK(topology.output.find("topology.ranks_per_node: 4 does not divide workers = 2") != std::string::npos);
  const auto on_nccl =
      run_scape("validate " + (dir.path / "g.json").string() + " --backend nccl --set optimizer.hierarchy=node");
  CHECK(on_nccl.code == 2);
  CHECK(on_nccl.output.find("optimizer.hierarchy: \"node\" runs in the simulator and over MPI") != std::string::npos);
  const auto on_mpi =  // the MPI runtime splits its groups (tests/runtime/test_mpi_runs.cpp)
      run_scape("validate " + (dir.path / "g.json").string() + " --backend mpi --set optimizer.hierarchy=node");
  CAPTURE(on_mpi.output);
  CHECK(on_mpi.code == 0);
  // The noisy quadratic computes its gradients on the host: no model to place on a GPU.
  write_file(dir.path / "q.json", kQuadratic);
  // Its one tensor cannot be dealt whole to two rails.
  refused("q.json", "topology.ranks_per_node=2 --set optimizer.hierarchy=node",
          "optimizer.rail_split: \"tensors\" deals whole tensors to topology.ranks_per_node = 2 rails, and model.type "
          "\"quadratic\" has 1; use \"rows\"");
  refused("q.json", "device=cuda", "device: \"cuda\" places a language model on the GPU");
  // A GPU asked for where there is none: refused before anything is written, naming the key the
  // user wrote.
  if (scape::kernels::cuda_device_count() == 0) {
    refused("g.json", "optimizer.device=cuda", "optimizer.device: cuda, but");
    refused("g.json", "device=cuda", "device: cuda, but", "optimizer.device");
    refused("g.json", "device=cuda --set optimizer.type=adams", "device: cuda, but", "optimizer.device");
  }
  // Missing and corrupt data files: the message names the file.
  write_file(dir.path / "text.json", R"({"steps": 2, "model": {"vocab_size": 256, "n_layer": 1, "n_embd": 16, "n_head": 2},
                                         "data": {"type": "text", "path": "missing.txt"}})");
  write_file(dir.path / "tokens.json", R"({"steps": 2, "model": {"vocab_size": 256, "n_layer": 1, "n_embd": 16, "n_head": 2},
                                           "data": {"type": "tokens", "path": "corrupt.bin"}})");
  for (const char* name : {"text.json", "tokens.json"}) {
    const auto r = run_scape("run " + (dir.path / name).string() + " --out " + (dir.path / "x.h5").string() + " --quiet");
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(std::string(name) == "text.json" ? "missing.txt" : "corrupt.bin") != std::string::npos);
    CHECK_FALSE(fs::exists(dir.path / "x.h5"));
  }
  const auto bad_json = run_scape("run " + (dir.path / "bad.json").string() + " --quiet");
  CHECK(bad_json.code == 2);
  CHECK(bad_json.output.find("bad.json: invalid JSON") != std::string::npos);
  const auto missing = run_scape("validate " + (dir.path / "nope.json").string());
  CHECK(missing.code != 0);
  const auto valid = run_scape("validate " + (dir.path / "g.json").string());
  CHECK(valid.code == 0);
  CHECK(valid.output.find("\"min_lr\": 0.0003") != std::string::npos);  // documented default lr / 10
  const auto schema = run_scape("schema");
  CHECK(schema.code == 0);
  CHECK(schema.output.find("\"mask_statistic\"") != std::string::npos);
  CHECK(schema.output.find("\"x-applies-to\"") != std::string::npos);
  const auto predict_schema = run_scape("schema --predict");
  CHECK(predict_schema.code == 0);
  CHECK(predict_schema.output.find("\"gpus_per_node\"") != std::string::npos);
}

TEST_CASE("a diverging run ends with status diverged, exit 3, and keeps its metrics") {
  TempDir dir;
  write_file(dir.path / "g.json", kTinyGpt);
  const auto r = run_scape("run " + (dir.path / "g.json").string() + " --out " + (dir.path / "div.h5").string() +
                       " --quiet --set optimizer.lr=1e3 --set steps=40 --set optimizer.type=adamw");
  CAPTURE(r.output);
  CHECK(r.code == 3);
  const auto s = scape::run_file::read_run_summary(dir.path / "div.h5");
  CHECK(s.status == "diverged");
  CHECK(s.steps_completed >= 1);
  CHECK(s.error.find("step") != std::string::npos);
  const auto loss = read_metric(dir.path / "div.h5", "train_loss");
  CHECK(static_cast<long>(loss.size()) == s.steps_completed);
  const bool flagged = !std::isfinite(loss.back()) || read_metric(dir.path / "div.h5", "nonfinite_grads").back() > 0;
  CHECK(flagged);
}

TEST_CASE("SIGKILL mid-run leaves a readable file; resume ends bit-identical to an uninterrupted run") {
  TempDir dir;
  // Long enough that the kill lands between the first checkpoint and the end: under the
  // sanitizers every step is several times slower, so a smaller model keeps that window.
#if defined(__SANITIZE_ADDRESS__)
  const std::string size = "300000";
#else
  const std::string size = "1500000";
#endif
  const std::string cfg = R"({
    "name": "long", "seed": 9, "workers": 2, "steps": 60,
    "model": {"type": "quadratic", "size": )" + size + R"(},
    "optimizer": {"type": "scape", "sparsity": 0.9, "lr": 0.01},
    "log": {"flush_interval": 2, "save_params": true, "oracle": false}
  })";
  write_file(dir.path / "l.json", cfg);
  const auto straight = run_scape("run " + (dir.path / "l.json").string() + " --out " + (dir.path / "a.h5").string() + " --quiet");
  REQUIRE(straight.code == 0);

  const fs::path killed = dir.path / "b.h5";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(SCAPE_BINARY, SCAPE_BINARY, "run", (dir.path / "l.json").c_str(), "--out", killed.c_str(), "--quiet",
            "--checkpoint-every", "10", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Kill once the first checkpoint exists and a few more steps were flushed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(killed.string() + ".ckpt") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(fs::exists(killed.string() + ".ckpt"));
  const auto s = scape::run_file::read_run_summary(killed);
  CHECK(s.status == "running");
  const auto loss = read_metric(killed, "train_loss");
  CHECK(loss.size() >= 10);
  CHECK(loss.size() < 60);
  const auto full = read_metric(dir.path / "a.h5", "train_loss");
  for (std::size_t t = 0; t < loss.size(); ++t) CHECK(loss[t] == full[t]);

  const auto resumed = run_scape("run " + (dir.path / "l.json").string() + " --out " + killed.string() + " --quiet --resume");
  CAPTURE(resumed.output);
  REQUIRE(resumed.code == 0);
  auto pa = scape::run_file::File::open(dir.path / "a.h5", scape::run_file::Access::read).open_dataset("/final/params").read_all<float>();
  auto pb = scape::run_file::File::open(killed, scape::run_file::Access::read).open_dataset("/final/params").read_all<float>();
  REQUIRE(pa.size() == pb.size());
  CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
  CHECK(read_metric(killed, "train_loss") == full);
  CHECK(scape::run_file::read_run_summary(killed).status == "completed");
}
