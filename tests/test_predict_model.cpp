// The predictor's model against hand-computed values: ring and hierarchical collective times,
// parameter counts of the model presets against published counts, FLOPs per token, the
// optimizer-step bytes, the bucketed overlap rule, and the limits every sound model obeys
// (one worker, infinite bandwidth, doubling bandwidth).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/ledger.hpp"
#include "model/gpt.hpp"
#include "model/llama.hpp"
#include "optimizers/volume.hpp"
#include "predict/model_layout.hpp"
#include "predict/prediction.hpp"
#include "predict/step_model.hpp"
#include "predict/topology.hpp"
#include "presets/model_presets.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using namespace scape::predict;
using namespace scape::presets;

namespace {

constexpr auto AR = CollectiveKind::all_reduce;
constexpr auto RS = CollectiveKind::reduce_scatter;
constexpr auto AG = CollectiveKind::all_gather;
constexpr double kInf = std::numeric_limits<double>::infinity();

Topology flat(double alpha_s, double bandwidth_Bps) {
  return Topology{1, 1, NetworkModel{3e-6, 450e9}, NetworkModel{alpha_s, bandwidth_Bps}};
}

Topology two_level(int gpus, int nics) {
  return Topology{gpus, nics, NetworkModel{3e-6, 450e9}, NetworkModel{5e-6, 50e9}};
}

OptimizerConfig optimizer(OptimizerType type, bool sharded, double sparsity = 0.99) {
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.type = type;
  c.sharded = sharded;
  c.sparsity = sparsity;
  return c;
}

// Every optimizer family and the switches that change its collectives.
std::vector<OptimizerConfig> all_optimizers() {
  std::vector<OptimizerConfig> out = {
      optimizer(OptimizerType::adams, true),  optimizer(OptimizerType::adams, false),
      optimizer(OptimizerType::adamw, true),  optimizer(OptimizerType::scape, true),
      optimizer(OptimizerType::scape, false), optimizer(OptimizerType::scape, true, 0.9),
      optimizer(OptimizerType::topk_ef, false)};
  auto dense_update = optimizer(OptimizerType::scape, true);
  dense_update.scape.update = UpdateMode::dense;
  out.push_back(dense_update);
  auto two = optimizer(OptimizerType::scape, true);
  two.scape.second_moment = SecondMoment::two_collectives;
  out.push_back(two);
  auto local = optimizer(OptimizerType::scape, false);
  local.scape.mask_partition = MaskPartition::local_union;
  out.push_back(local);
  auto lag0 = optimizer(OptimizerType::scape, true);
  lag0.scape.mask_lag = 0;
  out.push_back(lag0);
  return out;
}

StepInputs inputs(const OptimizerConfig& c, const Topology& topo) {
  StepInputs in;
  in.optimizer = c;
  in.n_params = 354871296;
  in.flops_per_token = 2.27e9;
  in.fill_in = 2.0;
  in.gpu = GpuSpec{"gh200", 989.0, 0.4, 4.9};
  in.topology = topo;
  return in;
}

}  // namespace

TEST_CASE("flat ring times are the ledger's alpha-beta values (one GPU per node)") {
  const Topology t = flat(5e-6, 50e9);
  // all-reduce of 1 GB on 32 workers: 2*31 alpha + 2*(31/32)*1e9 / 50e9
  CHECK(collective_time(AR, 1e9, t, 32) == doctest::Approx(62 * 5e-6 + 2 * 31.0 / 32 * 1e9 / 50e9).epsilon(1e-12));
  CHECK(collective_time(RS, 1e9, t, 32) == doctest::Approx(31 * 5e-6 + 31.0 / 32 * 1e9 / 50e9).epsilon(1e-12));
  CHECK(collective_time(AG, 4e6, t, 4) == doctest::Approx(3 * 5e-6 + 0.75 * 4e6 / 50e9).epsilon(1e-12));
  CHECK(collective_time(AR, 1e3, t, 2) == doctest::Approx(2 * 5e-6 + 1e3 / 50e9).epsilon(1e-12));
  CHECK(collective_time(AR, 1e9, t, 1) == 0.0);
  for (const auto kind : {AR, RS, AG}) {
    for (const int w : {1, 2, 3, 7, 64, 256}) {
      for (const double n : {0.0, 1e3, 1e6, 7.1e8}) {
        CHECK(collective_time(kind, n, t, w) == alpha_beta_time(kind, w, n, t.inter));
      }
    }
  }
}

TEST_CASE("hierarchical collectives: 8 GPUs per node on NVLink, nodes on InfiniBand") {
  const Topology t = two_level(8, 8);
  const double n = 1e9;
  // W = 32: 8 GPUs in each of 4 nodes; the inter-node rings carry n / 8 per rail.
  const double intra = 7 * 3e-6 + 7.0 / 8 * n / 450e9;
  const double inter_half = 3 * 5e-6 + 3.0 / 4 * (n / 8) / 50e9;
  const double inter_full = 6 * 5e-6 + 2 * 3.0 / 4 * (n / 8) / 50e9;
  CHECK(collective_time(RS, n, t, 32) == doctest::Approx(intra + inter_half).epsilon(1e-12));
  CHECK(collective_time(AG, n, t, 32) == doctest::Approx(intra + inter_half).epsilon(1e-12));
  CHECK(collective_time(AR, n, t, 32) == doctest::Approx(2 * intra + inter_full).epsilon(1e-12));
  // W = 256 (32 nodes), 4 MB all-gather.
  const double m = 4e6;
  CHECK(collective_time(AG, m, t, 256) ==
        doctest::Approx(7 * 3e-6 + 7.0 / 8 * m / 450e9 + 31 * 5e-6 + 31.0 / 32 * (m / 8) / 50e9).epsilon(1e-12));
  // W = 16 all-reduce of 1 KB: latency-bound.
  CHECK(collective_time(AR, 1e3, t, 16) ==
        doctest::Approx(2 * (7 * 3e-6 + 7.0 / 8 * 1e3 / 450e9) + 2 * 5e-6 + 1e3 / 8 / 50e9).epsilon(1e-12));
  // W <= G stays inside one node: a flat NVLink ring.
  CHECK(collective_time(AR, n, t, 4) == doctest::Approx(6 * 3e-6 + 1.5 * n / 450e9).epsilon(1e-12));
  // Bytes one GPU sends per level.
  const auto b = link_bytes_per_gpu(AR, n, t, 32);
  CHECK(b.intra == doctest::Approx(2 * 7.0 / 8 * n));
  CHECK(b.inter == doctest::Approx(2 * 3.0 / 4 * n / 8));
  CHECK(link_bytes_per_gpu(RS, n, t, 4).inter == 0.0);
}

TEST_CASE("fewer ports than GPUs share the port's bandwidth") {
  // One 50 GB/s port for 8 GPUs: 6.25 GB/s per rail.
  const Topology t = two_level(8, 1);
  const double n = 1e9;
  CHECK(collective_time(RS, n, t, 32) ==
        doctest::Approx(7 * 3e-6 + 7.0 / 8 * n / 450e9 + 3 * 5e-6 + 0.75 * (n / 8) / 6.25e9).epsilon(1e-12));
  CHECK(collective_time(RS, n, two_level(8, 2), 32) ==
        doctest::Approx(7 * 3e-6 + 7.0 / 8 * n / 450e9 + 3 * 5e-6 + 0.75 * (n / 8) / 12.5e9).epsilon(1e-12));
}

TEST_CASE("placement: whole nodes beyond one node") {
  const Topology t = two_level(8, 8);
  CHECK(place(t, 8).nodes == 1);
  CHECK(place(t, 5).gpus_per_node == 5);
  CHECK(place(t, 64).nodes == 8);
  CHECK_THROWS_AS(place(t, 12), std::invalid_argument);
  CHECK_THROWS_AS(place(t, 0), std::invalid_argument);
}

TEST_CASE("parameter counts of the presets equal the published counts") {
  CHECK(parameter_count(find_model_preset("gpt2-124m", "").spec) == 124439808);
  CHECK(parameter_count(find_model_preset("gpt2-medium", "").spec) == 354823168);
  CHECK(parameter_count(find_model_preset("gpt2-large", "").spec) == 774030080);
  CHECK(parameter_count(find_model_preset("gpt2-xl", "").spec) == 1557611200);
  CHECK(parameter_count(find_model_preset("llama2-7b", "").spec) == 6738415616);
  CHECK(parameter_count(find_model_preset("tinyllama-1.1b", "").spec) == 1100048384);
  for (const auto& p : model_presets()) {
    CAPTURE(p.name);
    if (p.published_params != 0) CHECK(parameter_count(p.spec) == p.published_params);
  }
  // Assumed shapes (docs/PREDICTING.md): their counts, computed by hand.
  // GPT-345M: GPT-2 medium with 47 more vocabulary rows of width 1024.
  CHECK(parameter_count(find_model_preset("gpt-345m", "").spec) == 354823168 + 47 * 1024);
  // Llama with grouped heads: 2 V d + L (2 d^2 + 2 d d_kv + 3 d f + 2 d) + d, d_kv = groups * head width.
  // The artifact's Llama-500M (its logs print 513,590,784): d 1536, 16 heads of 96, 8 groups.
  CHECK(parameter_count(find_model_preset("llama-500m", "").spec) ==
        2ull * 32000 * 1536 + 16ull * (2ull * 1536 * 1536 + 2ull * 1536 * 768 + 3ull * 1536 * 4096 + 2 * 1536) + 1536);
  CHECK(parameter_count(find_model_preset("llama-500m", "").spec) == 513590784);
  // Llama-1.8B: d 2560, 32 heads of 80, 8 groups (d_kv 640), f 6912, vocab 32000.
  CHECK(parameter_count(find_model_preset("llama-1.8b", "").spec) ==
        2ull * 32000 * 2560 + 24ull * (2ull * 2560 * 2560 + 2ull * 2560 * 640 + 3ull * 2560 * 6912 + 2 * 2560) + 2560);
  // The assumed Llama-1.3B: d 2048, 16 heads of 128, 8 groups (d_kv 1024), f 5632.
  CHECK(parameter_count(find_model_preset("llama-1.3b", "").spec) ==
        2ull * 32000 * 2048 + 24ull * (2ull * 2048 * 2048 + 2ull * 2048 * 1024 + 3ull * 2048 * 5632 + 2 * 2048) + 2048);
  CHECK_THROWS_WITH_AS(find_model_preset("gpt-9", "model.preset"), doctest::Contains("model.preset"),
                       std::invalid_argument);
}

TEST_CASE("the presets' tensors: as many elements as the count, and the model code's own layout") {
  for (const auto& p : model_presets()) {
    CAPTURE(p.name);
    const ParamLayout layout = tensor_layout(p.spec);
    CHECK(layout.size() == parameter_count(p.spec));  // llama2-7b: above 2^32, which kUnbounded allows
  }
  // GPT-2 small is a GptConfig the model code builds: the same tensors, shapes and decay flags.
  const ParamLayout predicted = tensor_layout(find_model_preset("gpt2-124m", "").spec);
  const ParamLayout built = model::transformer_layout(model::transformer_shape(
      model::GptConfig{.n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 1024, .vocab_size = 50257}));
  REQUIRE(predicted.slots().size() == built.slots().size());
  for (std::size_t i = 0; i < built.slots().size(); ++i) {
    CHECK(predicted.slots()[i].name == built.slots()[i].name);
    CHECK(predicted.slots()[i].shape == built.slots()[i].shape);
    CHECK(predicted.slots()[i].decay == built.slots()[i].decay);
  }
  // TinyLlama: grouped-query attention, 4 key-value heads of 64: qkv rows 2048 + 2 * 256.
  const ParamLayout tiny = tensor_layout(find_model_preset("tinyllama-1.1b", "").spec);
  CHECK(tiny.slot("h.0.attn.qkv.w").shape == std::vector<std::size_t>{2560, 2048});
  CHECK(tiny.slot("lm_head.w").decay);
  // A layout an optimizer steps keeps the 32-bit limit.
  model::LlamaConfig seven{.n_layer = 32, .n_head = 32, .n_embd = 4096, .block_size = 4096, .vocab_size = 32000,
                           .ffn_hidden = 11008};
  CHECK_THROWS_WITH_AS(model::transformer_layout(model::transformer_shape(seven)), doctest::Contains("2^32-1"),
                       std::invalid_argument);
}

TEST_CASE("SwiGLU width, matmul parameters and FLOPs per token") {
  CHECK(llama_ffn_hidden(4096) == 11008);
  CHECK(llama_ffn_hidden(2048) == 5632);
  CHECK(llama_ffn_hidden(1280) == 3584);
  const ModelSpec gpt = find_model_preset("gpt2-124m", "").spec;
  // The position table is only looked up; the tied token table is the output head.
  CHECK(matmul_parameter_count(gpt) == 124439808 - 1024 * 768);
  const ModelSpec llama = find_model_preset("llama2-7b", "").spec;
  CHECK(matmul_parameter_count(llama) == 6738415616 - 32000ull * 4096);
  // 6 N_matmul + 6 L T d (causal), 12 L T d (full).
  const double params = 6.0 * (124439808 - 1024 * 768);
  CHECK(training_flops_per_token(gpt, 1024, AttentionFlops::causal) == doctest::Approx(params + 6.0 * 12 * 1024 * 768));
  CHECK(training_flops_per_token(gpt, 1024, AttentionFlops::full) == doctest::Approx(params + 12.0 * 12 * 1024 * 768));
  CHECK(training_flops_per_token(gpt, 512, AttentionFlops::none) == doctest::Approx(params));
}

TEST_CASE("compute time and the optimizer step from bytes touched") {
  StepInputs in = inputs(optimizer(OptimizerType::adams, true), flat(5e-6, 50e9));
  in.n_params = 1000;
  const auto s = predict_step(in, 4, 16384);
  // forward = 1/3 of 6 N T / (peak MFU); backward twice that.
  CHECK(s.forward_s == doctest::Approx(2.27e9 * 16384 / (3 * 989e12 * 0.4)));
  CHECK(s.backward_s == doctest::Approx(2 * s.forward_s));
  // AdamS on its shard: 64 ceil(1000 / 256) = 256 elements, 20 bytes each.
  CHECK(optimizer_step_bytes(optimizer(OptimizerType::adams, true), 1000, 4, 0) == 20.0 * 256);
  CHECK(optimizer_step_bytes(optimizer(OptimizerType::adamw, false), 1000, 4, 0) == 28.0 * 1000);
  CHECK(s.optimizer_s == doctest::Approx(20.0 * 256 / 4.9e12));
  // SCAPE sharded, masked: accumulate 12 N, rank the shard 20 S, pack 16 K, decay 8 N, step
  // 44 ceil(K / W), compact and expand 12 (ceil(K / W) + K). N = 1000, W = 4, S = 256, K = 12.
  CHECK(optimizer_step_bytes(optimizer(OptimizerType::scape, true), 1000, 4, 12) ==
        12.0 * 1000 + 20 * 256 + 16 * 12 + 8 * 1000 + 44 * 3 + 12 * (3 + 12));
  // Replicated top-k: accumulate and select 20 N, pack 16 K, sum W K pairs (12 each), clear and
  // divide 12 N, AdamS on N.
  CHECK(optimizer_step_bytes(optimizer(OptimizerType::topk_ef, false), 1000, 4, 10) ==
        20.0 * 1000 + 16 * 10 + 12 * 4 * 10 + 12 * 1000 + 20 * 1000);
}

TEST_CASE("bucketed overlap: the last bucket is always exposed") {
  CHECK(bucketed_exposed(0.0, 10, 1.0) == 0.0);
  CHECK(bucketed_exposed(1.0, 1, 100.0) == 1.0);                           // one bucket cannot overlap
  CHECK(bucketed_exposed(1.0, 10, 100.0) == doctest::Approx(0.1));         // link faster than compute
  CHECK(bucketed_exposed(10.0, 10, 5.0) == doctest::Approx(10 - 5 * 0.9));  // link slower than compute
  CHECK(bucketed_exposed(2.0, 4, 0.0) == 2.0);
  // The predictor's closed form for equal buckets is the simulator's pipeline
  // (core/ledger.hpp, backward_buckets_exposed) with B equal buckets.
  for (int b : {1, 2, 3, 8, 25}) {
    for (double total : {0.3, 1.0, 7.0}) {
      CAPTURE(b);
      CAPTURE(total);
      CommRecord bucket;
      bucket.payload_bytes = 4096;
      bucket.modelled_time_s = total / b;
      bucket.in_backward = true;
      const std::vector<CommRecord> buckets(static_cast<std::size_t>(b), bucket);
      CHECK(backward_buckets_exposed(buckets, 2.0) == doctest::Approx(bucketed_exposed(total, b, 2.0)).epsilon(1e-12));
    }
  }
}

TEST_CASE("overlap switches decide what is exposed") {
  const Topology t = flat(5e-6, 50e9);
  StepInputs in = inputs(optimizer(OptimizerType::adams, true), t);
  in.overlap.grad_reduce = false;
  in.overlap.param_gather = false;
  const auto blocking = predict_step(in, 32, 16384);
  CHECK(blocking.exposed_comm_s == doctest::Approx(blocking.comm_s));
  for (const auto& c : blocking.collectives) CHECK(c.buckets == 1);
  in.overlap = OverlapModel{};
  const auto hidden = predict_step(in, 32, 16384);
  CHECK(hidden.exposed_comm_s < 0.2 * hidden.comm_s);
  // N fp32 gradients, 1.42 GB, in 25 MB buckets.
  CHECK(hidden.collectives[0].buckets == static_cast<int>(std::ceil(354871296 * 4 / 25e6)));
  // SCAPE's lagged mask gather hides behind compute unless switched off.
  StepInputs s = inputs(optimizer(OptimizerType::scape, true), t);
  const auto lagged = predict_step(s, 32, 16384);
  REQUIRE(lagged.collectives.back().record.purpose == "mask_all_gather");
  CHECK(lagged.collectives.back().window == Window::compute);
  CHECK(lagged.collectives.back().exposed_s == 0.0);
  s.overlap.mask_gather = false;
  const auto exposed = predict_step(s, 32, 16384);
  CHECK(exposed.collectives.back().exposed_s == exposed.collectives.back().time_s);
}

TEST_CASE("limit: one worker has no communication and efficiency 1") {
  for (const auto& c : all_optimizers()) {
    for (const auto scaling : {Scaling::strong, Scaling::weak}) {
      PredictConfig p;
      p.model = find_model_preset("gpt2-124m", "").spec;
      p.batch.scaling = scaling;
      p.batch.global_sequences = 64;
      p.batch.per_gpu_sequences = 8;
      p.inter = LinkSpec{"", 5, 50};
      p.intra = LinkSpec{"", 3, 450};
      p.optimizer = c;
      p.baseline = default_baseline(c);
      p.workers = {1};
      const auto pred = run_prediction(p);
      const auto& row = pred.rows.front();
      CHECK(row.optimizer.comm_s == 0.0);
      CHECK(row.optimizer.exposed_comm_s == 0.0);
      CHECK(row.baseline.comm_s == 0.0);
      CHECK(row.efficiency == 1.0);
      CHECK(row.baseline_efficiency == 1.0);
      for (const auto& col : row.optimizer.collectives) CHECK(col.record.bytes_sent_per_worker == 0.0);
    }
  }
}

TEST_CASE("limit: infinite bandwidth (and zero latency) makes every optimizer as fast as dense") {
  for (const int gpus : {1, 8}) {
    Topology t{gpus, gpus, NetworkModel{0, kInf}, NetworkModel{0, kInf}};
    for (const auto& c : all_optimizers()) {
      StepInputs opt = inputs(c, t);
      opt.gpu.memory_TBps = kInf;
      opt.gpu.mask_codec_Gcoords_per_s = kInf;
      StepInputs dense = opt;
      dense.optimizer = optimizer(OptimizerType::adams, c.sharded);
      for (const int w : {1, 2, 8, 64}) {
        const double speedup = predict_step(dense, w, 4096).step_s / predict_step(opt, w, 4096).step_s;
        CHECK(speedup == doctest::Approx(1.0).epsilon(1e-15));
      }
    }
  }
}

TEST_CASE("limit: doubling a bandwidth never slows anything down") {
  for (const bool overlap : {true, false}) {
    for (const auto& c : all_optimizers()) {
      for (const int gpus : {1, 4}) {
        for (const double inter : {1e9, 12.5e9, 50e9}) {
          for (const double memory : {1.0, 4.9}) {
            StepInputs slow = inputs(c, Topology{gpus, 1, NetworkModel{3e-6, 4 * inter}, NetworkModel{5e-6, inter}});
            slow.gpu.memory_TBps = memory;
            slow.overlap.grad_reduce = slow.overlap.param_gather = slow.overlap.sparse_reduce = overlap;
            StepInputs fast_net = slow;
            fast_net.topology.inter.bandwidth_Bps *= 2;
            StepInputs fast_nvlink = slow;
            fast_nvlink.topology.intra.bandwidth_Bps *= 2;
            StepInputs fast_memory = slow;
            fast_memory.gpu.memory_TBps *= 2;
            for (const int w : {1, 4, 16, 64}) {
              const auto base = predict_step(slow, w, 2048);
              for (const auto* faster : {&fast_net, &fast_nvlink, &fast_memory}) {
                const auto f = predict_step(*faster, w, 2048);
                CHECK(f.step_s <= base.step_s);
                CHECK(f.exposed_comm_s <= base.exposed_comm_s);
                REQUIRE(f.collectives.size() == base.collectives.size());
                for (std::size_t i = 0; i < f.collectives.size(); ++i) {
                  CHECK(f.collectives[i].time_s <= base.collectives[i].time_s);
                  CHECK(f.collectives[i].exposed_s <= base.collectives[i].exposed_s + 1e-15);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("mask coding time: a measured throughput, else the CUDA kernels' bytes at the memory bandwidth") {
  OptimizerConfig c;  // SCAPE 99%, partitioned, Elias-Fano
  const std::uint64_t n = 64'000'000;
  const int w = 8;
  GpuSpec gpu;
  gpu.memory_TBps = 2.0;
  // K = 8 shards of 8e6 at 1%: 80,000 each.
  const double k = 8 * 80'000.0;
  CHECK(mask_codec_seconds(c, n, w, gpu) == doctest::Approx((n / 8.0 + 8 * k + 0.75 * n / w) / 2e12));
  gpu.mask_codec_Gcoords_per_s = 4.0;
  // A worker encodes N/W and decodes N: (1 + 1/8) / 2 of N at 4e9 per second.
  CHECK(mask_codec_seconds(c, n, w, gpu) == doctest::Approx(0.5625 * n / 4e9));
  c.mask_encoding = MaskEncoding::bitmap;
  CHECK(mask_codec_seconds(c, n, w, gpu) == 0.0);
  c.mask_encoding = MaskEncoding::auto_select;
  c.scape.mask_partition = MaskPartition::local_union;
  c.sharded = false;
  CHECK(mask_codec_seconds(c, n, w, gpu) == 0.0);
  c = scape::testing::earlier_formulation();
  c.type = OptimizerType::adams;
  CHECK(mask_codec_seconds(c, n, w, gpu) == 0.0);
}

TEST_CASE("local SGD: the mean step over an outer period, the sync exposed or hidden behind the next inner step") {
  const double alpha = 5e-6, bandwidth = 1e9;
  OptimizerConfig c = optimizer(OptimizerType::diloco, false);
  c.inner = InnerRule::adamw;
  c.outer.inner_steps = 10;
  StepInputs in = inputs(c, flat(alpha, bandwidth));
  in.n_params = 1000000;
  const int w = 4;
  const auto s = predict_step(in, w, 2048);
  // One fp32 ring all-reduce of N values every H = 10 steps: 2(W-1) alpha + 2(W-1)/W 4N / B.
  const double sync = 2 * (w - 1) * alpha + 2.0 * (w - 1) / w * 4e6 / bandwidth;
  REQUIRE(s.collectives.size() == 1);
  CHECK(s.collectives[0].record.purpose == "outer_all_reduce");
  CHECK(s.comm_s == doctest::Approx(sync / 10));
  CHECK(s.exposed_comm_s == doctest::Approx(sync / 10));
  CHECK(s.collectives[0].record.bytes_sent_per_worker == doctest::Approx(2.0 * (w - 1) / w * 4e6 / 10));
  // AdamW over all N every step, the outer update (40 bytes a coordinate) once a period.
  CHECK(s.optimizer_bytes == doctest::Approx(28.0 * 1e6 + 40.0 * 1e6 / 10));
  CHECK(s.step_s == doctest::Approx(s.compute_s() + s.optimizer_s + sync / 10));

  // DiLoCoX's delay: only what outlasts the next forward and backward is exposed.
  c.outer.overlap_outer = true;
  in.optimizer = c;
  const auto hidden = predict_step(in, w, 2048);
  CHECK(hidden.comm_s == doctest::Approx(sync / 10));
  CHECK(hidden.exposed_comm_s == doctest::Approx(std::max(0.0, sync - hidden.compute_s()) / 10));
  in.flops_per_token = 1e3;  // compute far shorter than the sync
  const auto short_compute = predict_step(in, w, 2048);
  CHECK(short_compute.exposed_comm_s == doctest::Approx((sync - short_compute.compute_s()) / 10));

  // Streaming DiLoCo, F = 5: a fifth of N every 2 steps, each sync hidden on its own.
  c.diloco.streaming_fragments = 5;
  in.optimizer = c;
  const auto streaming = predict_step(in, w, 2048);
  const double fragment_sync = 2 * (w - 1) * alpha + 2.0 * (w - 1) / w * 4e6 / 5 / bandwidth;
  CHECK(streaming.comm_s == doctest::Approx(5 * fragment_sync / 10));
  CHECK(streaming.exposed_comm_s == doctest::Approx(5 * (fragment_sync - streaming.compute_s()) / 10));
}

TEST_CASE("local SGD: SparseLoCo's all-gather of every worker's message once a period") {
  OptimizerConfig c = optimizer(OptimizerType::sparseloco, false, 0.98);
  c.outer.inner_steps = 50;
  StepInputs in = inputs(c, flat(0, 1e9));
  in.n_params = 1 << 20;
  const auto s = predict_step(in, 8, 2048);
  REQUIRE(s.collectives.size() == 1);
  CHECK(s.collectives[0].record.purpose == "sparseloco_all_gather");
  // The ledger's own record of the sync step, spread over the 50 steps of the period.
  const auto sync = step_collectives(c, in.n_params, 8, 50, 101, in.topology.inter);
  REQUIRE(sync.size() == 1);
  CHECK(s.collectives[0].record.bytes_sent_per_worker == doctest::Approx(sync[0].bytes_sent_per_worker / 50));
  CHECK(s.comm_s == doctest::Approx(sync[0].bytes_sent_per_worker / 1e9 / 50));
}
