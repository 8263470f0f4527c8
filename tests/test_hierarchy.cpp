// optimizer.hierarchy = "node" (docs/algorithms.md, "Hierarchy"). The identity that defines it:
// hierarchical SCAPE (AdamS, DiLoCo) on n nodes of G ranks equals, rail by rail, the flat method
// on n workers whose gradients are the node means, restricted to the rail's part: the same masks
// at every step and the same parameters bit for bit, since the reference takes the node mean
// with the communicator's own rank-order sum. Gradients come from a replay trace. Also the rail
// split rules, the split communicators, the ledger's link classes and the measured times the
// groups hand to the world communicator.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "optimizers/hierarchical.hpp"
#include "optimizers/make_optimizer.hpp"
#include "optimizers/volume.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/hdf5_handle.hpp"
#include "run_file/trace.hpp"
#include "sim/emulated_comm.hpp"
#include "test_support.hpp"

using namespace scape;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 6;

// Seven 1-D tensors of unequal sizes (a replay trace's layout), two of them kept dense by name.
ParamLayout trace_layout() {
  ParamLayout layout;
  layout.add("wte", {301}, true);
  layout.add("h0.w", {203}, true);
  layout.add("h0.bias", {19}, false);
  layout.add("h1.w", {177}, true);
  layout.add("h1.norm", {23}, false);
  layout.add("h2.w", {131}, true);
  layout.add("head", {149}, true);
  return layout;
}

run_file::DatasetShape shape_of(std::vector<hsize_t> dims) {
  run_file::DatasetShape shape;
  shape.dims = std::move(dims);
  return shape;
}

// A replay trace of `workers` workers' gradients: seeded normal values, a per-worker offset so
// that the node means differ from any one worker's gradient.
fs::path write_trace(const testing::TempDir& dir, const ParamLayout& layout, int workers) {
  const fs::path path = dir.path / ("trace_w" + std::to_string(workers) + ".h5");
  const auto lock = run_file::lock_hdf5();
  const run_file::File file = run_file::File::create(path);
  std::vector<std::string> names;
  std::vector<std::int64_t> sizes;
  std::vector<std::uint8_t> decay;
  for (const auto& s : layout.slots()) {
    names.push_back(s.name);
    sizes.push_back(static_cast<std::int64_t>(s.numel()));
    decay.push_back(s.decay ? 1 : 0);
  }
  file.create_string_dataset("layout/names", names);
  const auto l = static_cast<hsize_t>(names.size());
  file.create_dataset("layout/sizes", H5T_STD_I64LE, shape_of({l})).write<std::int64_t>({0}, {l}, sizes);
  file.create_dataset("layout/decay", H5T_STD_U8LE, shape_of({l})).write<std::uint8_t>({0}, {l}, decay);
  const std::size_t n = layout.size();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> init(n), grads;
  for (float& x : init) x = 0.1f * normal(rng);
  file.create_dataset("init/params", H5T_IEEE_F32LE, shape_of({n})).write<float>({0}, {n}, init);
  for (int t = 0; t < kSteps; ++t)
    for (int w = 0; w < workers; ++w)
      for (std::size_t j = 0; j < n; ++j) grads.push_back(normal(rng) + 0.05f * static_cast<float>(w));
  const auto steps = static_cast<hsize_t>(kSteps), ws = static_cast<hsize_t>(workers);
  file.create_dataset("grads", H5T_IEEE_F32LE, shape_of({steps, ws, n})).write<float>({0, 0, 0}, {steps, ws, n}, grads);
  return path;
}

// What one rank saw at every step: its parameters after the step (its rail's part for the
// reference runs) and the mask its method used.
struct RankTrack {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<std::uint64_t>> masks;
  std::vector<StepMetrics> metrics;
};

void track(RankTrack& r, std::span<const float> params, const Optimizer& method, StepMetrics metrics) {
  r.params.emplace_back(params.begin(), params.end());
  const auto mask = method.mask();
  r.masks.emplace_back(mask.begin(), mask.end());
  r.metrics.push_back(std::move(metrics));
}

// The hierarchical run on W ranks, each reading its own gradients from the trace.
std::vector<RankTrack> run_hierarchical(const OptimizerConfig& config, const run_file::GradientTrace& trace,
                                        const ParamLayout& layout, int workers, NetworkModel net = {}) {
  std::vector<RankTrack> out(static_cast<std::size_t>(workers));
  sim::run_ranks(workers, net, [&](Communicator& comm) {
    auto opt = make_optimizer(config, layout, comm, kSteps);
    const auto& hier = dynamic_cast<const HierarchicalOptimizer&>(*opt);
    std::vector<float> theta(layout.size()), g(layout.size());
    trace.read_init(theta);
    for (int t = 1; t <= kSteps; ++t) {
      trace.read_grad(t, comm.rank(), g);
      StepMetrics m = opt->step(theta, g);
      track(out[static_cast<std::size_t>(comm.rank())], theta, hier.rail_method(), std::move(m));
    }
    opt->finish();
  });
  return out;
}

// The flat reference of one rail: n workers on the rail's part, worker r's gradient the mean of
// node r's G gradients (rank order, the communicator's own sum).
std::vector<RankTrack> run_rail_reference(const OptimizerConfig& flat, const run_file::GradientTrace& trace,
                                          const RailPart& part, int nodes, int g) {
  std::vector<RankTrack> out(static_cast<std::size_t>(nodes));
  const std::size_t n = trace.size();
  sim::run_ranks(nodes, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(flat, part.layout, comm, kSteps);
    std::vector<float> full(n), theta(part.size()), mean(n), rail_grad(part.size());
    std::vector<std::vector<float>> node_grads(static_cast<std::size_t>(g), std::vector<float>(n));
    trace.read_init(full);
    pack_rail(part, full, theta);
    for (int t = 1; t <= kSteps; ++t) {
      std::vector<const float*> inputs;
      for (int i = 0; i < g; ++i) {
        trace.read_grad(t, comm.rank() * g + i, node_grads[static_cast<std::size_t>(i)]);
        inputs.push_back(node_grads[static_cast<std::size_t>(i)].data());
      }
      mean_in_rank_order(inputs, mean);
      pack_rail(part, mean, rail_grad);
      StepMetrics m = opt->step(theta, rail_grad);
      track(out[static_cast<std::size_t>(comm.rank())], theta, *opt, std::move(m));
    }
    opt->finish();
  });
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Every rank's ledger records of every step against the closed forms of its rail.
void check_closed_forms(const OptimizerConfig& hier, const ParamLayout& layout, const std::vector<RankTrack>& run) {
  const int workers = static_cast<int>(run.size());
  for (int rank = 0; rank < workers; ++rank) {
    for (int t = 1; t <= kSteps; ++t) {
      CAPTURE(rank);
      CAPTURE(t);
      const auto want = rail_step_collectives(hier, layout, workers, rank % hier.ranks_per_node, t, kSteps, {});
      const auto& got = run[static_cast<std::size_t>(rank)].metrics[static_cast<std::size_t>(t - 1)].comm;
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(got[i].purpose);
        CHECK(got[i].purpose == want[i].purpose);
        CHECK(got[i].payload_bytes == want[i].payload_bytes);
        CHECK(got[i].bytes_sent_per_worker == want[i].bytes_sent_per_worker);
        CHECK(got[i].link == want[i].link);
      }
    }
  }
}

// The identity, checked for every rank and step, and the ledger against the closed forms.
void check_identity(const OptimizerConfig& config, int nodes, int g) {
  testing::TempDir dir;
  const ParamLayout layout = trace_layout();
  const int workers = nodes * g;
  const run_file::GradientTrace trace(write_trace(dir, layout, workers));
  OptimizerConfig hier = config;
  hier.hierarchy = Hierarchy::node;
  hier.ranks_per_node = g;
  const auto run = run_hierarchical(hier, trace, layout, workers);
  check_closed_forms(hier, layout, run);
  const auto parts = split_into_rails(layout, g, config.rail_split);
  OptimizerConfig flat = config;
  flat.rail_split = RailSplit::tensors;
  for (int l = 0; l < g; ++l) {
    const RailPart& part = parts[static_cast<std::size_t>(l)];
    const auto ref = run_rail_reference(flat, trace, part, nodes, g);
    for (int r = 0; r < nodes; ++r) {
      const RankTrack& mine = run[static_cast<std::size_t>(r * g + l)];
      const RankTrack& want = ref[static_cast<std::size_t>(r)];
      for (int t = 0; t < kSteps; ++t) {
        CAPTURE(l);
        CAPTURE(r);
        CAPTURE(t);
        std::vector<float> rail_params(part.size());
        pack_rail(part, mine.params[static_cast<std::size_t>(t)], rail_params);
        CHECK(same_bits(rail_params, want.params[static_cast<std::size_t>(t)]));
        CHECK(mine.masks[static_cast<std::size_t>(t)] == want.masks[static_cast<std::size_t>(t)]);
        if (config.type == OptimizerType::scape) CHECK(!want.masks[static_cast<std::size_t>(t)].empty());
      }
    }
  }
  // Inside a node every rank holds the same parameters after each step (the node's all-gather).
  for (int r = 0; r < nodes; ++r)
    for (int i = 1; i < g; ++i)
      for (int t = 0; t < kSteps; ++t)
        CHECK(same_bits(run[static_cast<std::size_t>(r * g + i)].params[static_cast<std::size_t>(t)],
                        run[static_cast<std::size_t>(r * g)].params[static_cast<std::size_t>(t)]));
}

// For the elementwise methods (dense AdamS, DiLoCo) the rails together are the flat run on the
// whole layout: every rank's parameters equal those of the flat run's worker r (its node).
void check_whole_layout(const OptimizerConfig& config, int nodes, int g) {
  testing::TempDir dir;
  const ParamLayout layout = trace_layout();
  const run_file::GradientTrace trace(write_trace(dir, layout, nodes * g));
  OptimizerConfig hier = config;
  hier.hierarchy = Hierarchy::node;
  hier.ranks_per_node = g;
  const auto run = run_hierarchical(hier, trace, layout, nodes * g);
  OptimizerConfig flat = config;
  flat.rail_split = RailSplit::tensors;
  const auto ref = run_rail_reference(flat, trace, split_into_rails(layout, 1, RailSplit::tensors).front(), nodes, g);
  for (int rank = 0; rank < nodes * g; ++rank)
    for (int t = 0; t < kSteps; ++t)
      CHECK(same_bits(run[static_cast<std::size_t>(rank)].params[static_cast<std::size_t>(t)],
                      ref[static_cast<std::size_t>(rank / g)].params[static_cast<std::size_t>(t)]));
}

OptimizerConfig scape_config(Formulation formulation, int lag, RailSplit split) {
  OptimizerConfig c;
  c.type = OptimizerType::scape;
  c.sparsity = 0.9;
  c.lr = 1e-2;
  c.scape.formulation = formulation;
  c.scape.mask_lag = lag;
  c.rail_split = split;
  return c;
}

}  // namespace

TEST_CASE("hierarchy node: SCAPE equals flat SCAPE on the node means, rail by rail, bit for bit") {
  for (const Formulation f : {Formulation::paper, Formulation::frozen_momentum})
    for (const int lag : {0, 1})
      for (const RailSplit split : {RailSplit::tensors, RailSplit::rows})
        for (const int nodes : {2, 3})
          for (const int g : {2, 4}) {
            CAPTURE(to_string(f));
            CAPTURE(lag);
            CAPTURE(to_string(split));
            CAPTURE(nodes);
            CAPTURE(g);
            check_identity(scape_config(f, lag, split), nodes, g);
          }
}

TEST_CASE("hierarchy node: dense AdamS and DiLoCo equal their flat runs on the node means") {
  OptimizerConfig adams;
  adams.type = OptimizerType::adams;
  adams.lr = 1e-2;
  OptimizerConfig diloco;
  diloco.type = OptimizerType::diloco;
  diloco.lr = 1e-2;
  diloco.sharded = false;
  diloco.outer.inner_steps = 2;
  for (const OptimizerConfig& base : {adams, diloco})
    for (const RailSplit split : {RailSplit::tensors, RailSplit::rows})
      for (const int nodes : {2, 3})
        for (const int g : {2, 4}) {
          CAPTURE(to_string(base.type));
          CAPTURE(to_string(split));
          CAPTURE(nodes);
          CAPTURE(g);
          OptimizerConfig c = base;
          c.rail_split = split;
          check_identity(c, nodes, g);
          check_whole_layout(c, nodes, g);
        }
}

TEST_CASE("hierarchy node with one rank a node is the flat path bit for bit, and its node sends nothing") {
  testing::TempDir dir;
  const ParamLayout layout = trace_layout();
  const int workers = 3;
  const run_file::GradientTrace trace(write_trace(dir, layout, workers));
  for (const RailSplit split : {RailSplit::tensors, RailSplit::rows}) {
    OptimizerConfig flat = scape_config(Formulation::paper, 1, RailSplit::tensors);
    OptimizerConfig hier = flat;
    hier.hierarchy = Hierarchy::node;
    hier.rail_split = split;
    const auto run = run_hierarchical(hier, trace, layout, workers);
    const RailPart whole = split_into_rails(layout, 1, split).front();
    const auto ref = run_rail_reference(flat, trace, whole, workers, 1);
    for (int r = 0; r < workers; ++r) {
      for (int t = 0; t < kSteps; ++t) {
        const auto& mine = run[static_cast<std::size_t>(r)];
        const auto& want = ref[static_cast<std::size_t>(r)];
        CHECK(same_bits(mine.params[static_cast<std::size_t>(t)], want.params[static_cast<std::size_t>(t)]));
        CHECK(mine.masks[static_cast<std::size_t>(t)] == want.masks[static_cast<std::size_t>(t)]);
        const auto& comm = mine.metrics[static_cast<std::size_t>(t)].comm;
        CHECK(bytes_sent_on(comm, LinkClass::intra) == 0.0);
        CHECK(bytes_sent_on(comm, LinkClass::inter) ==
              summarize(want.metrics[static_cast<std::size_t>(t)].comm).bytes_sent_per_worker);
      }
    }
  }
}

TEST_CASE("hierarchy node: the node's collectives are intra bytes, 2 (G-1)/G 4N a rank and step") {
  testing::TempDir dir;
  const ParamLayout layout = trace_layout();
  const run_file::GradientTrace trace(write_trace(dir, layout, 8));
  OptimizerConfig hier;
  hier.type = OptimizerType::adams;
  hier.hierarchy = Hierarchy::node;
  hier.ranks_per_node = 4;
  const auto run = run_hierarchical(hier, trace, layout, 8);
  const double n_bytes = 4.0 * static_cast<double>(layout.size());
  const auto parts = split_into_rails(layout, 4, RailSplit::tensors);
  for (int rank = 0; rank < 8; ++rank) {
    const auto& comm = run[static_cast<std::size_t>(rank)].metrics.front().comm;
    CHECK(bytes_sent_on(comm, LinkClass::intra) == 2 * 0.75 * n_bytes);
    // Sharded AdamS on the rail's part among 2 nodes: reduce-scatter and all-gather, half each.
    const double part_bytes = 4.0 * static_cast<double>(parts[static_cast<std::size_t>(rank % 4)].size());
    CHECK(bytes_sent_on(comm, LinkClass::inter) == 2 * 0.5 * part_bytes);
  }
}

TEST_CASE(
    "hierarchy node: the node's collectives are modelled with network.intra's link, the rails' with the world's") {
  testing::TempDir dir;
  const ParamLayout layout = trace_layout();
  const run_file::GradientTrace trace(write_trace(dir, layout, 4));
  const NetworkModel between{10e-6, 1e9}, inside{1e-6, 400e9};
  OptimizerConfig hier = scape_config(Formulation::paper, 1, RailSplit::rows);
  hier.hierarchy = Hierarchy::node;
  hier.ranks_per_node = 2;
  hier.node_link = inside;
  const auto run = run_hierarchical(hier, trace, layout, 4, between);
  int node_records = 0, rail_records = 0;
  for (const auto& rank : run) {
    for (const auto& step : rank.metrics) {
      for (const auto& r : step.comm) {
        CAPTURE(r.purpose);
        const bool node = r.link == LinkClass::intra;
        const double want = alpha_beta_time(r.kind, 2, static_cast<double>(r.payload_bytes), node ? inside : between);
        CHECK(r.modelled_time_s == want);
        CHECK(r.modelled_time_s > 0);
        ++(node ? node_records : rail_records);
      }
    }
  }
  CHECK(node_records == 4 * kSteps * 2);
  CHECK(rail_records >= 4 * kSteps);
  // The closed forms model them alike.
  for (int t = 1; t <= kSteps; ++t) {
    const auto want = rail_step_collectives(hier, layout, 4, 1, t, kSteps, between);
    const auto& got = run[1].metrics[static_cast<std::size_t>(t - 1)].comm;
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].modelled_time_s == want[i].modelled_time_s);
  }
}

TEST_CASE("rail split: tensors dealt largest first to the lightest rail; rows cut as torch.chunk") {
  ParamLayout layout;
  layout.add("a", {10, 3}, true);  // 30
  layout.add("b", {5}, false);     // 5
  layout.add("c", {7, 4}, true);   // 28
  layout.add("d", {2, 2}, true);   // 4
  const auto tensors = split_into_rails(layout, 2, RailSplit::tensors);
  // a (30) to rail 0, c (28) to rail 1, b (5) to rail 1 (28 < 30), d (4) to rail 0 (30 < 33).
  REQUIRE(tensors[0].layout.slots().size() == 2);
  CHECK(tensors[0].layout.slots()[0].name == "a");
  CHECK(tensors[0].layout.slots()[1].name == "d");
  CHECK(tensors[1].layout.slots()[0].name == "b");  // layout order kept on the rail
  CHECK(tensors[1].layout.slots()[1].name == "c");
  CHECK(tensors[1].pieces[1].offset == 35);
  CHECK(tensors[1].size() == 33);
  const auto rows = split_into_rails(layout, 3, RailSplit::rows);
  // a: 10 rows in chunks of 4, 4, 2; b: 5 in 2, 2, 1; c: 7 in 3, 3, 1; d: 2 in 1, 1, (none).
  CHECK(rows[0].layout.slots()[0].shape == std::vector<std::size_t>{4, 3});
  CHECK(rows[2].layout.slots()[0].shape == std::vector<std::size_t>{2, 3});
  CHECK(rows[2].pieces[0].offset == 24);
  CHECK(rows[1].pieces[2].offset == 35 + 12);  // c's rows 3..5
  CHECK(rows[2].layout.slots().size() == 3);   // d has no third slice
  CHECK(rows[0].size() + rows[1].size() + rows[2].size() == layout.size());
  CHECK_THROWS_WITH_AS(split_into_rails(layout, 5, RailSplit::tensors),
                       doctest::Contains("optimizer.rail_split: \"tensors\" leaves rail 4 of 5 without parameters"),
                       std::invalid_argument);
  // pack then unpack is the identity on the part, and leaves the rest alone.
  std::vector<float> full(layout.size()), packed(rows[1].size()), back(layout.size(), -1.0f);
  for (std::size_t j = 0; j < full.size(); ++j) full[j] = static_cast<float>(j);
  pack_rail(rows[1], full, packed);
  CHECK(packed.front() == 12.0f);
  unpack_rail(rows[1], packed, back);
  CHECK(back[12] == 12.0f);
  CHECK(back[0] == -1.0f);
}

TEST_CASE("split communicators: node and rail groups reduce among their own ranks, in rank order") {
  std::vector<std::vector<float>> node_means(6), rail_means(6);
  std::vector<int> node_sizes(6), rail_ranks(6);
  sim::run_ranks(6, NetworkModel{}, [&](Communicator& world) {
    const auto r = static_cast<std::size_t>(world.rank());
    auto node = world.split(world.rank() / 3, LinkClass::intra, {});
    auto rail = world.split(world.rank() % 3, LinkClass::inter, {});
    std::vector<float> x = {static_cast<float>(world.rank())};
    node->all_reduce_mean(x, WireType::fp32, "node");
    node_means[r] = x;
    x = {static_cast<float>(world.rank())};
    rail->all_reduce_mean(x, WireType::fp32, "rail");
    rail_means[r] = x;
    node_sizes[r] = node->size();
    rail_ranks[r] = rail->rank();
    CHECK(node->ledger().drain().front().link == LinkClass::intra);
    CHECK(rail->ledger().drain().front().link == LinkClass::inter);
    CHECK(world.ledger().drain().empty());  // each group records in its own ledger
  });
  for (int r = 0; r < 6; ++r) {
    CHECK(node_means[static_cast<std::size_t>(r)][0] == (r < 3 ? 1.0f : 4.0f));
    CHECK(rail_means[static_cast<std::size_t>(r)][0] == static_cast<float>(r % 3) + 1.5f);
    CHECK(node_sizes[static_cast<std::size_t>(r)] == 3);
    CHECK(rail_ranks[static_cast<std::size_t>(r)] == r / 3);
  }
}

TEST_CASE("hierarchy node: the world communicator's measured times hold the node's and the rail's collectives") {
  const ParamLayout layout = trace_layout();
  OptimizerConfig hier;
  hier.type = OptimizerType::adams;
  hier.hierarchy = Hierarchy::node;
  hier.ranks_per_node = 2;
  std::mutex mutex;
  std::vector<std::map<std::string, double>> measured;
  std::vector<double> blocking, again;
  sim::run_ranks(4, NetworkModel{}, [&](Communicator& world) {
    auto opt = make_optimizer(hier, layout, world, kSteps);
    std::vector<float> theta(layout.size(), 0.5f), g(layout.size(), 0.25f);
    (void)opt->step(theta, g);
    auto times = world.take_measured_times();
    const double b = world.take_blocking_seconds();
    const double after = static_cast<double>(world.take_measured_times().size()) + world.take_blocking_seconds();
    const std::lock_guard lock(mutex);
    measured.push_back(std::move(times));
    blocking.push_back(b);
    again.push_back(after);
  });
  REQUIRE(measured.size() == 4);
  for (std::size_t r = 0; r < 4; ++r) {
    std::vector<std::string> purposes;
    double sum = 0;
    for (const auto& [purpose, seconds] : measured[r]) {
      purposes.push_back(purpose);
      CHECK(seconds >= 0);
      sum += seconds;
    }
    // Sharded AdamS on each rail: its reduce-scatter and all-gather among the 2 nodes, all
    // synchronous, so every second of them is blocking.
    CHECK(purposes == std::vector<std::string>{"grad_reduce_scatter", "node_grad_reduce_scatter",
                                               "node_param_all_gather", "param_all_gather"});
    CHECK(blocking[r] == doctest::Approx(sum));
    CHECK(again[r] == 0.0);  // moved, not copied: taken once
  }
}

TEST_CASE("split communicators: a rank that fails in a subgroup aborts the others instead of hanging") {
  CHECK_THROWS_WITH_AS(sim::run_ranks(4, NetworkModel{},
                                      [&](Communicator& world) {
                                        auto node = world.split(world.rank() / 2, LinkClass::intra, {});
                                        if (world.rank() == 3) throw std::runtime_error("rank 3 failed");
                                        std::vector<float> x = {1.0f};
                                        node->all_reduce_mean(x, WireType::fp32, "node");
                                        world.barrier();
                                      }),
                       "rank 3 failed", std::runtime_error);
}
