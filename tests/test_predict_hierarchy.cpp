// scape predict under optimizer.hierarchy = "node" (docs/PREDICTING.md, "Hierarchy") against
// hand-computed values: the node's reduce-scatter and all-gather among its g GPUs on NVLink, the
// rail's method among the M nodes on each GPU's share of the node's ports, bytes charged to each
// class, and the optimizer costed on the rail's part; the flat prediction unchanged by the new
// code path; the optimizer's memory per GPU over the rail's part.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/ledger.hpp"
#include "core/schedule.hpp"
#include "optimizers/volume.hpp"
#include "predict/model_layout.hpp"
#include "predict/prediction.hpp"
#include "predict/step_model.hpp"
#include "predict/topology.hpp"
#include "presets/model_presets.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using namespace scape::predict;

namespace {

constexpr auto AR = CollectiveKind::all_reduce;
constexpr auto RS = CollectiveKind::reduce_scatter;
constexpr auto AG = CollectiveKind::all_gather;
const NetworkModel kNvlink{3e-6, 450e9};
const NetworkModel kIb{5e-6, 50e9};

// Four equal tensors of 1M values: under "tensors" each of four rails holds one.
ParamLayout four_tensors() {
  ParamLayout layout;
  for (const char* name : {"w0", "w1", "w2", "w3"}) layout.add(name, {1u << 20}, true);
  return layout;
}

StepInputs inputs(OptimizerType type, bool sharded, Hierarchy hierarchy, int nics) {
  StepInputs in;
  in.optimizer = scape::testing::earlier_formulation();
  in.optimizer.type = type;
  in.optimizer.sharded = sharded;
  in.optimizer.sparsity = 0.99;
  in.optimizer.hierarchy = hierarchy;
  in.layout = four_tensors();
  in.n_params = in.layout.size();
  in.fixed_compute_s = 0.1;
  in.gpu = presets::GpuSpec{"gh200", 989.0, 0.4, 4.9};
  in.topology = Topology{4, nics, kNvlink, kIb};
  in.overlap.grad_reduce = in.overlap.param_gather = false;  // every collective exposed
  return in;
}

double time_of(const StepPrediction& s, const std::string& purpose) {
  double t = 0;
  for (const auto& c : s.collectives) {
    if (c.record.purpose == purpose) t += c.time_s;
  }
  return t;
}

}  // namespace

TEST_CASE(
    "dense AdamS on 2 nodes of 4 GPUs: node reduce-scatter and all-gather on NVLink, the rail's all-reduce across") {
  const double n = 4.0 * (1u << 20), bytes = 4 * n;  // fp32
  for (const int nics : {4, 1}) {
    CAPTURE(nics);
    const auto s = predict_step(inputs(OptimizerType::adams, false, Hierarchy::node, nics), 8, 1024);
    // Inside the node: a ring over the 4 GPUs of the whole gradient, then of the parameters.
    CHECK(time_of(s, "node_grad_reduce_scatter") == doctest::Approx(alpha_beta_time(RS, 4, bytes, kNvlink)));
    CHECK(time_of(s, "node_param_all_gather") == doctest::Approx(alpha_beta_time(AG, 4, bytes, kNvlink)));
    // Across: rail l's quarter (one tensor) all-reduced between the 2 nodes, each GPU on its share
    // of the ports: the whole port with one a GPU, a quarter with one a node.
    const NetworkModel port{kIb.alpha_s, kIb.bandwidth_Bps * (nics == 4 ? 1.0 : 0.25)};
    CHECK(time_of(s, "grad_all_reduce") == doctest::Approx(alpha_beta_time(AR, 2, bytes / 4, port)));
    double intra = 0, inter = 0;
    for (const auto& c : s.collectives) {
      intra += c.intra_bytes;
      inter += c.inter_bytes;
    }
    CHECK(intra == doctest::Approx(2 * 0.75 * bytes));     // (g-1)/g of 4N, twice
    CHECK(inter == doctest::Approx(2 * 0.5 * bytes / 4));  // 2 (M-1)/M of the rail's 4N/g
    CHECK(s.exposed_comm_s == doctest::Approx(s.comm_s));  // nothing overlapped here
    CHECK(s.step_s == doctest::Approx(s.compute_s() + s.optimizer_s + s.comm_s));
  }
}

TEST_CASE("SCAPE 99%: what crosses the nodes is the flat method's bytes on the rail's part among the nodes") {
  auto in = inputs(OptimizerType::scape, false, Hierarchy::node, 4);
  const auto node = predict_step(in, 8, 1024);
  // The flat method on one rail's part (one tensor of 1M, "tensors") among the 2 nodes.
  OptimizerConfig flat = in.optimizer;
  flat.hierarchy = Hierarchy::flat;
  ParamLayout one;
  one.add("w0", {1u << 20}, true);
  const int t = steady_state_step(flat);
  double want_inter = 0;
  for (const auto& r : step_collectives(flat, one, 2, t, t + 1, kIb)) {
    want_inter += ring_bytes_sent_per_worker(r.kind, 2, static_cast<double>(r.payload_bytes));
  }
  double inter = 0, intra = 0;
  for (const auto& c : node.collectives) {
    inter += c.inter_bytes;
    intra += c.intra_bytes;
  }
  CHECK(want_inter > 0);
  CHECK(inter == doctest::Approx(want_inter));
  CHECK(intra == doctest::Approx(2 * 0.75 * 16.0 * (1u << 20)));  // the node's dense pair
  // The optimizer steps the rail's 1M among the 2 nodes, its K that of one tensor among 2.
  const std::size_t k = mask_k(flat, one, 2, density_at(flat.density_schedule(), t));
  CHECK(node.optimizer_bytes == doctest::Approx(optimizer_bytes_by_kernel(flat, one.size(), 2, k).total()));
  const auto whole = predict_step(inputs(OptimizerType::scape, false, Hierarchy::flat, 4), 8, 1024);
  CHECK(node.optimizer_bytes < whole.optimizer_bytes / 2);
}

TEST_CASE("hierarchy node needs the model's tensors, and a flat prediction is unchanged by it") {
  auto in = inputs(OptimizerType::adams, false, Hierarchy::node, 4);
  in.layout = ParamLayout{ParamLayout::kUnbounded};
  CHECK_THROWS_WITH_AS(predict_step(in, 8, 1024),
                       doctest::Contains("optimizer.hierarchy: \"node\" is predicted over the model's tensors"),
                       std::invalid_argument);
  // Flat dense AdamS, replicated: one hierarchical ring all-reduce of 4N on 8 GPUs as 2 x 4.
  const auto flat = predict_step(inputs(OptimizerType::adams, false, Hierarchy::flat, 4), 8, 1024);
  const double bytes = 16.0 * (1u << 20);
  CHECK(time_of(flat, "grad_all_reduce") ==
        doctest::Approx(collective_time(AR, bytes, Topology{4, 4, kNvlink, kIb}, 8)));
}

TEST_CASE("hierarchy node over a model above 2^32 parameters: the rails' parts keep the predictor's unbounded layout") {
  // Llama 2 7B (6,738,415,616 parameters) on one GPU, the reference of the scaling efficiency:
  // one rail holds the whole model, more than the 2^32 - 1 elements an optimizer can index.
  const ParamLayout layout = tensor_layout(presets::find_model_preset("llama2-7b", "").spec);
  REQUIRE(layout.size() > ParamLayout::kMaxIndexed);
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.type = OptimizerType::scape;
  c.hierarchy = Hierarchy::node;
  for (const auto split : {RailSplit::tensors, RailSplit::rows}) {
    c.rail_split = split;
    const MethodShare one = method_share(c, layout, layout.size(), 1, 1);
    CHECK(one.n == layout.size());
    const MethodShare four = method_share(c, layout, layout.size(), 8, 4);
    CHECK(four.n < layout.size() / 3);
    CHECK(four.workers == 2);
  }
}

// Four tensors of 1M (N = 4M) on 2 nodes of 4 GPUs: under "tensors" each rail's part is one
// tensor, N / 4, among M = 2 nodes. A rank's state is the flat method's over that part; its
// memory adds the buffers of the step and the wrapper's N + 2 part floats.
TEST_CASE("optimizer memory per GPU: the state over the rail's part, G = 4 times less for what is replicated") {
  const double n = 4.0 * (1u << 20), part = n / 4;
  const ParamLayout layout = four_tensors();
  PredictConfig c;
  c.gpus_per_node = 4;
  const auto memory = [&](OptimizerConfig o, Hierarchy h, int workers) {
    o.hierarchy = h;
    return optimizer_memory(c, o, layout, workers);
  };
  SUBCASE("dense AdamS, replicated: m and g_bar over what the rank steps, a block sum a 8192") {
    const OptimizerConfig o = scape::testing::earlier_replicated(OptimizerType::adams);
    CHECK(memory(o, Hierarchy::flat, 8).state_bytes == 4 * n);
    CHECK(memory(o, Hierarchy::flat, 8).bytes == 8 * n + 8 * (n / 8192));
    CHECK(memory(o, Hierarchy::node, 8).state_bytes == 4 * part);
    CHECK(memory(o, Hierarchy::node, 8).bytes == 8 * part + 8 * (part / 8192) + 4 * (n + 2 * part));
    // W = 2 fills one node with 2 GPUs: G = 2, two tensors a rail.
    CHECK(memory(o, Hierarchy::node, 2).state_bytes == 4 * (n / 2));
  }
  SUBCASE("SCAPE 99%, sharded: m (and the carried momentum) over N / W either way, the residual over N / G") {
    OptimizerConfig o;  // the default formulation
    o.sparsity = 0.99;
    const double own = o.carries_owner_momentum() ? 2 : 1;
    CHECK(memory(o, Hierarchy::flat, 8).state_bytes == 4 * (own * n / 8 + n));
    CHECK(memory(o, Hierarchy::node, 8).state_bytes == 4 * (own * part / 2 + part));
    o.residual_offload = true;  // the residual on the host: the moments alone
    CHECK(memory(o, Hierarchy::node, 8).state_bytes == 4 * own * part / 2);
  }
  SUBCASE("DiLoCo: m, theta_global and the outer momentum, all replicated") {
    OptimizerConfig o;
    o.type = OptimizerType::diloco;
    o.sharded = false;
    CHECK(memory(o, Hierarchy::flat, 8).state_bytes == 4 * 3 * n);
    CHECK(memory(o, Hierarchy::node, 8).state_bytes == 4 * 3 * part);
  }
  SUBCASE("a method without a count has no figure") {
    OptimizerConfig o = scape::testing::earlier_replicated(OptimizerType::topk_ef);
    CHECK(std::isnan(memory(o, Hierarchy::flat, 8).state_bytes));
    CHECK(std::isnan(memory(o, Hierarchy::flat, 8).bytes));
  }
}
