// The CUDA kernels (kernels/cuda) against the CPU reference kernels (kernels/cpu): every kernel
// runs on both sides on the same inputs and the outputs are compared bit for bit, for inputs
// with random normals, many ties (three values), all-equal values and NaN/inf/-0/denormals, at
// sizes 0, 1, 63, 64, 65, 1000, a few odd sizes and 2^26. Without a visible device the program
// prints why and exits 77 (ctest: skipped).
//
// This file: the list of compared kernels, top-k, the Adam steps, the elementwise kernels and
// the metrics' reductions; test_cuda_passes.cpp the SCAPE passes, compressors, bitmasks and
// compaction; test_cuda_model_ops.cpp the model ops and the backend (helpers: cuda_compare.hpp).
//
// Why elementwise results can be compared bit for bit: kernels/cuda is compiled with
// --fmad=false and the CPU kernels for x86-64-v2 (no FMA), so neither side contracts a*b+c;
// + - * / and sqrt are correctly rounded IEEE operations on both (nvcc defaults -prec-div,
// -prec-sqrt, -ftz=false; the CPU build uses no fast-math); the step scalars are rounded from
// double on the host by the same code; and each kernel keeps the CPU's operation order. The
// only allowed difference is the payload of a NaN produced by arithmetic (x86 propagates an
// operand's payload, the GPU returns the canonical NaN), so two NaNs compare equal.
#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>
#include <string_view>

#include "cuda_compare.hpp"
#include "kernels/update_stats.hpp"

using namespace scape::testing;

namespace {

// The kernels this file compares, one row each. Every kernel of kernels/kernel_list.inc must
// have a row (and a comparison here or in test_cuda_passes.cpp or test_cuda_model_ops.cpp): a
// kernel added to the list without one, or a row left for a kernel the list no longer has,
// fails this file's build.
constexpr std::string_view kComparedKernels[] = {
    "adamw_step",
    "adams_step",
    "adamw_step_masked",
    "adams_step_masked",
    "scale",
    "divide",
    "accumulate",
    "topk_abs_mask",
    "topk_abs_indices",
    "pack_bits",
    "unpack_bits",
    "popcount",
    "popcount_and",
    "popcount_or",
    "mask_range_counts",
    "bits_to_indices",
    "indices_to_bits",
    "and_not_bits",
    "or_bits",
    "extract_bits",
    "deposit_bits",
    "ef_encode",
    "ef_decode",
    "ef_decode_indices",
    "compact",
    "expand",
    "zero_at",
    "scatter_add",
    "first_moment_statistic",
    "carried_first_moment_statistic",
    "candidate_momentum",
    "carry_momentum_off_mask",
    "candidate_statistic_carry",
    "quantize_e5m2",
    "momentum_from_gradient",
    "random_statistic",
    "pack_payload",
    "rebase_indices",
    "add_momentum",
    "reconstruct_gradient",
    "owner_payload_gradient",
    "round_to_bf16",
    "fill",
    "block_sum_squares",
    "max_magnitude",
    "block_sum_squares_max",
    "count_nonfinite",
    "update_statistics",
    "keep_and_decay_at",
    "decay_update_statistics",
    "sign_compress",
    "sign_expand_add",
    "lowrank_project",
    "lowrank_project_t",
    "lowrank_residual",
    "orthonormalize_columns",
    "chunk_transform",
    "chunk_topk",
    "sign_descent",
    "gemm",
    "gemm_bf16",
    "bias_forward",
    "bias_backward",
    "residual_add",
    "embedding_forward",
    "embedding_backward",
    "layernorm_forward",
    "layernorm_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "rope_forward",
    "rope_backward",
    "gelu_forward",
    "gelu_backward",
    "swiglu_forward",
    "swiglu_backward",
    "attention_forward",
    "attention_backward",
    "cross_entropy",
};

constexpr std::string_view kListedKernels[] = {
#define SCAPE_KERNEL(result, name, parameters, arguments) #name,
#include "kernels/kernel_list.inc"
#undef SCAPE_KERNEL
};

// The list's names are distinct (each declares a function), so equal counts and every listed
// name among the rows make the two sets equal.
constexpr bool every_listed_kernel_compared() {
  if (std::size(kListedKernels) != std::size(kComparedKernels)) return false;
  for (const std::string_view listed : kListedKernels) {
    if (std::find(std::begin(kComparedKernels), std::end(kComparedKernels), listed) == std::end(kComparedKernels)) {
      return false;
    }
  }
  return true;
}
static_assert(every_listed_kernel_compared(),
              "kernels/kernel_list.inc and kComparedKernels differ: give each listed kernel a CPU-vs-CUDA comparison");

// ---- top-k -------------------------------------------------------------------------------

void check_topk(const std::vector<float>& values, std::size_t k, const std::string& what) {
  const std::size_t n = values.size();
  std::vector<std::uint64_t> cpu(sk::words_for(n));
  sk::topk_abs_mask(values, k, cpu);
  const sk::Buffer<float> v = to_gpu(values);
  sk::Buffer<std::uint64_t> mask(gpu(), sk::words_for(n));
  gpu().topk_abs_mask(v, k, mask);
  const std::vector<std::uint64_t> got = to_host(mask);
  check_equal(cpu, got, what + " mask");
  CHECK_MESSAGE(sk::popcount(got) == k, what);
}

void check_topk_indices(const std::vector<float>& values, std::size_t k, const std::string& what) {
  std::vector<std::uint32_t> cpu(k);
  const std::size_t cpu_count = sk::topk_abs_indices(values, k, cpu);
  const sk::Buffer<float> v = to_gpu(values);
  sk::Buffer<std::uint32_t> out(gpu(), k + 3);  // larger than k: only out[0, k) is written
  const std::size_t count = gpu().topk_abs_indices(v, k, out);
  CHECK(count == cpu_count);
  std::vector<std::uint32_t> got = to_host(out);
  got.resize(k);
  check_equal(cpu, got, what + " indices");
}

}  // namespace

TEST_CASE("top-k mask matches the CPU on every input family, small and odd sizes") {
  std::uint32_t seed = 100;
  for_each_small_case([&](Family family, std::size_t n) {
    const std::vector<float> values = make_values(family, n, ++seed);
    for (const std::size_t k : ks_for(n)) check_topk(values, k, case_name(family, n) + " k=" + std::to_string(k));
  });
}

TEST_CASE("top-k at 2^26 matches the CPU (1% and 50%, every family)") {
  std::uint32_t seed = 200;
  for (const Family family : kFamilies) {
    const std::vector<float> values = make_values(family, kLarge, ++seed);
    check_topk(values, kLarge / 100, std::string(name(family)) + " 2^26 k=1%");
    if (family == Family::normal || family == Family::ties) check_topk(values, kLarge / 2, std::string(name(family)) + " 2^26 k=50%");
  }
}

TEST_CASE("top-k cuts exactly through long runs of ties in many blocks") {
  // Equal magnitudes in separate runs: the cut falls inside the run that spans block borders.
  std::vector<float> values(1'000'003);
  for (std::size_t j = 0; j < values.size(); ++j) values[j] = (j / 5000) % 3 == 0 ? 3.0f : ((j % 2) ? -1.0f : 1.0f);
  for (const std::size_t k : {std::size_t{1}, std::size_t{333'334}, std::size_t{400'000}, std::size_t{999'999}}) {
    check_topk(values, k, "runs k=" + std::to_string(k));
  }
}

TEST_CASE("top-k indices match the CPU") {
  std::uint32_t seed = 300;
  for (const Family family : kFamilies) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{65}, std::size_t{1000}, std::size_t{300'007}}) {
      const std::vector<float> values = make_values(family, n, ++seed);
      for (const std::size_t k : ks_for(n)) {
        check_topk_indices(values, k, case_name(family, n) + " k=" + std::to_string(k));
      }
    }
  }
  const std::vector<float> large = make_values(Family::normal, kLarge, 399);
  check_topk_indices(large, kLarge / 100, "normal 2^26 k=1%");
}

TEST_CASE("top-k is deterministic and checks its arguments like the CPU") {
  const std::vector<float> values = make_values(Family::ties, 100'000, 7);
  const sk::Buffer<float> v = to_gpu(values);
  sk::Buffer<std::uint64_t> a(gpu(), sk::words_for(values.size()));
  sk::Buffer<std::uint64_t> b(gpu(), sk::words_for(values.size()));
  gpu().topk_abs_mask(v, 12'345, a);
  gpu().topk_abs_mask(v, 12'345, b);
  check_equal(to_host(a), to_host(b), "repeat");
  CHECK_THROWS_AS(gpu().topk_abs_mask(v, values.size() + 1, a), std::invalid_argument);
  CHECK_THROWS_AS(gpu().topk_abs_mask(v, 10, std::span<std::uint64_t>(a.data(), a.size() - 1)), std::invalid_argument);
  sk::Buffer<std::uint32_t> small(gpu(), 9);
  CHECK_THROWS_AS(gpu().topk_abs_indices(v, 10, small), std::invalid_argument);
}

// ---- Adam steps ---------------------------------------------------------------------------

namespace {

struct AdamState {
  std::vector<float> theta, m, v, g;
};

AdamState adam_state(std::size_t n, Family g_family, std::uint32_t seed) {
  AdamState s;
  s.theta = make_values(Family::normal, n, seed);
  s.m = make_values(Family::normal, n, seed + 1);
  for (float& x : s.m) x *= 0.01f;
  s.v = positive_values(n, seed + 2);
  s.g = make_values(g_family, n, seed + 3);
  return s;
}

void check_dense_adam(std::size_t n, Family family, std::uint32_t seed, bool artifact_form) {
  const std::string what = case_name(family, n) + (artifact_form ? " (AdamS artifact form)" : "");
  const AdamState start = adam_state(n, family, seed);
  sk::AdamScalars s = step_scalars(7);
  s.adams_artifact_form = artifact_form;
  {
    AdamState cpu = start;
    sk::adamw_step(cpu.theta, cpu.m, cpu.v, cpu.g, s);
    sk::Buffer<float> theta = to_gpu(start.theta), m = to_gpu(start.m), v = to_gpu(start.v);
    const sk::Buffer<float> g = to_gpu(start.g);
    gpu().adamw_step(theta, m, v, g, s);
    check_equal(cpu.theta, to_host(theta), "adamw theta " + what);
    check_equal(cpu.m, to_host(m), "adamw m " + what);
    check_equal(cpu.v, to_host(v), "adamw v " + what);
  }
  {
    AdamState cpu = start;
    sk::adams_step(cpu.theta, cpu.m, cpu.g, s);
    sk::Buffer<float> theta = to_gpu(start.theta), m = to_gpu(start.m);
    const sk::Buffer<float> g = to_gpu(start.g);
    gpu().adams_step(theta, m, g, s);
    check_equal(cpu.theta, to_host(theta), "adams theta " + what);
    check_equal(cpu.m, to_host(m), "adams m " + what);
  }
}

void check_masked_adam(std::size_t n, std::uint32_t seed, bool artifact_form) {
  const std::string what = "n=" + std::to_string(n) + (artifact_form ? " (AdamS artifact form)" : "");
  const AdamState start = adam_state(n, Family::normal, seed);
  const std::vector<std::uint32_t> idx = random_indices(n, 0.3, seed + 10);
  const std::vector<float> m_new = make_values(Family::normal, idx.size(), seed + 11);
  const std::vector<float> g_bar = make_values(Family::special, idx.size(), seed + 12);
  sk::AdamScalars s = step_scalars(3);
  s.adams_artifact_form = artifact_form;
  const sk::Buffer<std::uint32_t> d_idx = to_gpu(idx);
  const sk::Buffer<float> d_m_new = to_gpu(m_new), d_g_bar = to_gpu(g_bar);
  {
    AdamState cpu = start;
    sk::adamw_step_masked(cpu.theta, cpu.m, cpu.v, idx, m_new, g_bar, s);
    sk::Buffer<float> theta = to_gpu(start.theta), m = to_gpu(start.m), v = to_gpu(start.v);
    gpu().adamw_step_masked(theta, m, v, d_idx, d_m_new, d_g_bar, s);
    check_equal(cpu.theta, to_host(theta), "adamw_masked theta " + what);
    check_equal(cpu.m, to_host(m), "adamw_masked m " + what);
    check_equal(cpu.v, to_host(v), "adamw_masked v " + what);
  }
  {
    AdamState cpu = start;
    sk::adams_step_masked(cpu.theta, cpu.m, idx, m_new, g_bar, s);
    sk::Buffer<float> theta = to_gpu(start.theta), m = to_gpu(start.m);
    gpu().adams_step_masked(theta, m, d_idx, d_m_new, d_g_bar, s);
    check_equal(cpu.theta, to_host(theta), "adams_masked theta " + what);
    check_equal(cpu.m, to_host(m), "adams_masked m " + what);
  }
}

}  // namespace

TEST_CASE("dense AdamW and AdamS steps are bit-identical to the CPU") {
  std::uint32_t seed = 400;
  for (const bool artifact_form : {false, true}) {
    for_each_small_case([&](Family family, std::size_t n) { check_dense_adam(n, family, seed += 10, artifact_form); });
    check_dense_adam(kLarge, Family::normal, 490, artifact_form);
    check_dense_adam(kLarge, Family::special, 495, artifact_form);
  }
}

TEST_CASE("masked AdamW and AdamS steps are bit-identical to the CPU") {
  std::uint32_t seed = 500;
  for (const bool artifact_form : {false, true}) {
    for (const std::size_t n : kSmallSizes) check_masked_adam(n, seed += 20, artifact_form);
    check_masked_adam(kLarge, 590, artifact_form);
  }
}

TEST_CASE("scale, divide, accumulate, fill and round_to_bf16 match the CPU") {
  std::uint32_t seed = 600;
  for_each_small_case([&](Family family, std::size_t n) {
    const std::string what = case_name(family, n);
    const std::vector<float> x = make_values(family, n, ++seed);
    const std::vector<float> g = make_values(Family::special, n, ++seed);

    std::vector<float> cpu = x;
    sk::scale(cpu, 0.7f);
    sk::Buffer<float> d = to_gpu(x);
    gpu().scale(d, 0.7f);
    check_equal(cpu, to_host(d), "scale " + what);

    cpu = x;
    sk::divide(cpu, 3.0f);
    d = to_gpu(x);
    gpu().divide(d, 3.0f);
    check_equal(cpu, to_host(d), "divide " + what);

    cpu = x;
    const std::size_t cpu_bad = sk::accumulate(cpu, g);
    d = to_gpu(x);
    const sk::Buffer<float> dg = to_gpu(g);
    CHECK(gpu().accumulate(d, dg) == cpu_bad);
    check_equal(cpu, to_host(d), "accumulate " + what);

    cpu = x;
    sk::fill(cpu, -3.5f);
    gpu().fill(d, -3.5f);
    check_equal(cpu, to_host(d), "fill " + what);

    cpu.assign(n, 0.0f);
    sk::round_to_bf16(x, cpu);
    d = to_gpu(x);
    sk::Buffer<float> out(gpu(), n);
    gpu().round_to_bf16(d, out);
    check_equal(cpu, to_host(out), "round_to_bf16 " + what);
    gpu().round_to_bf16(d, d);  // in place
    check_equal(cpu, to_host(d), "round_to_bf16 in place " + what);
  });
  const std::vector<float> big = make_values(Family::special, kLarge, 699);
  std::vector<float> cpu(kLarge, 1.0f);
  const std::size_t cpu_bad = sk::accumulate(cpu, big);
  sk::Buffer<float> d = to_gpu(std::vector<float>(kLarge, 1.0f));
  const sk::Buffer<float> dg = to_gpu(big);
  CHECK(gpu().accumulate(d, dg) == cpu_bad);
  check_equal(cpu, to_host(d), "accumulate 2^26");
}

// block_sum_squares_max's sums and block maxima on the GPU against the CPU's, bit for bit.
void check_block_sum_squares_max(const std::vector<float>& x, std::size_t block, const std::string& what) {
  std::vector<double> cpu((x.size() + block - 1) / block);
  std::vector<float> cpu_peak(cpu.size());
  sk::block_sum_squares_max(x, block, cpu, cpu_peak);
  sk::Buffer<double> partial(gpu(), cpu.size());
  sk::Buffer<float> peak(gpu(), cpu.size());
  gpu().block_sum_squares_max(to_gpu(x), block, partial, peak);
  check_equal(cpu, to_host(partial), "block_sum_squares_max " + what + " block=" + std::to_string(block));
  check_equal(cpu_peak, to_host(peak), "block_sum_squares_max peaks " + what + " block=" + std::to_string(block));
}

TEST_CASE("block_sum_squares, max_magnitude and block_sum_squares_max (the residual metrics) match the CPU") {
  // Each block is summed in lane order in double on both sides, so the partial sums are equal
  // bit for bit; NaN anywhere makes the maximum NaN on both.
  std::uint32_t seed = 650;
  for_each_small_case([&](Family family, std::size_t n) {
    const std::string what = case_name(family, n);
    const std::vector<float> x = make_values(family, n, ++seed);
    for (const std::size_t block : {std::size_t{1}, std::size_t{64}, std::size_t{100}, std::size_t{8192}}) {
      std::vector<double> cpu((n + block - 1) / block);
      sk::block_sum_squares(x, block, cpu);
      const sk::Buffer<float> d = to_gpu(x);
      sk::Buffer<double> partial(gpu(), cpu.size());
      gpu().block_sum_squares(d, block, partial);
      check_equal(cpu, to_host(partial), "block_sum_squares " + what + " block=" + std::to_string(block));
      check_block_sum_squares_max(x, block, what);
    }
    const sk::Buffer<float> d = to_gpu(x);
    CHECK(same_value(sk::max_magnitude(x), gpu().max_magnitude(d)));
  });
  const std::vector<float> big = make_values(Family::normal, kLarge, 699);
  std::vector<double> cpu(kLarge / 8192);
  sk::block_sum_squares(big, 8192, cpu);
  const sk::Buffer<float> d = to_gpu(big);
  sk::Buffer<double> partial(gpu(), cpu.size());
  gpu().block_sum_squares(d, 8192, partial);
  check_equal(cpu, to_host(partial), "block_sum_squares 2^26");
  CHECK(same_value(sk::max_magnitude(big), gpu().max_magnitude(d)));
  check_block_sum_squares_max(big, 8192, "2^26");
}

// Integer counts: exact on both devices whatever the order of the atomics.
TEST_CASE("mask_range_counts matches the CPU on unaligned, empty and whole ranges") {
  const std::size_t n = 100'003, words = sk::words_for(n);
  std::vector<std::uint64_t> mask(words), previous(words);
  for (std::size_t w = 0; w < words; ++w) {
    mask[w] = scape::rng::derive(741, w) & scape::rng::derive(742, w);
    previous[w] = scape::rng::derive(743, w);
  }
  const std::vector<std::uint64_t> ranges = {0, n, 1, 63, 64, 128, 77, 77, 5, 70'001, 99'999, n, 3, 4};
  for (const bool with_previous : {false, true}) {
    std::vector<std::uint64_t> cpu(3 * ranges.size() / 2);
    sk::mask_range_counts(mask, with_previous ? std::span<const std::uint64_t>(previous) : std::span<const std::uint64_t>{},
                          ranges, cpu);
    const sk::Buffer<std::uint64_t> g_mask = to_gpu(mask), g_previous = to_gpu(previous), g_ranges = to_gpu(ranges);
    sk::Buffer<std::uint64_t> g_counts(gpu(), cpu.size());
    gpu().mask_range_counts(g_mask, with_previous ? std::span<const std::uint64_t>(g_previous.span())
                                                  : std::span<const std::uint64_t>{},
                            g_ranges, g_counts);
    check_equal(cpu, to_host(g_counts), with_previous ? "mask_range_counts with previous" : "mask_range_counts");
  }
}

// Each block is walked by one thread in index order on both devices (kernels/update_stats.hpp):
// the sums, maxima, counts and new signs are equal bit for bit; the counts are exact anyway.
TEST_CASE("count_nonfinite and update_statistics (the update metrics) match the CPU bit for bit") {
  std::uint32_t seed = 720;
  for_each_small_case([&](Family family, std::size_t n) {
    const std::string what = case_name(family, n);
    const std::vector<float> theta = make_values(family, n, ++seed), before = make_values(Family::normal, n, ++seed);
    CHECK(sk::count_nonfinite(theta) == gpu().count_nonfinite(to_gpu(theta)));
    std::vector<std::uint64_t> stepped(sk::words_for(n));
    for (std::size_t w = 0; w < stepped.size(); ++w) stepped[w] = scape::rng::derive(seed, w);
    std::vector<std::int8_t> sign(n);
    for (std::size_t j = 0; j < n; ++j) sign[j] = static_cast<std::int8_t>(static_cast<int>(scape::rng::derive(seed + 1, j) % 3) - 1);
    for (const bool masked : {false, true}) {
      for (const std::size_t block : {std::size_t{1}, std::size_t{64}, std::size_t{100}, std::size_t{8192}}) {
        const std::size_t blocks = (n + block - 1) / block;
        std::vector<double> cpu(sk::kUpdateStats * blocks);
        std::vector<std::int8_t> cpu_sign = sign;
        const std::span<const std::uint64_t> on = masked ? std::span<const std::uint64_t>(stepped) : std::span<const std::uint64_t>{};
        sk::update_statistics(theta, before, on, true, cpu_sign, block, cpu);
        const sk::Buffer<std::uint64_t> g_on = to_gpu(stepped);
        sk::Buffer<std::int8_t> g_sign = to_gpu(sign);
        sk::Buffer<double> g_stats(gpu(), cpu.size());
        gpu().update_statistics(to_gpu(theta), to_gpu(before),
                                masked ? std::span<const std::uint64_t>(g_on.span()) : std::span<const std::uint64_t>{},
                                true, g_sign, block, g_stats);
        const std::string label = "update_statistics " + what + (masked ? " masked" : "") + " block=" + std::to_string(block);
        check_equal(cpu, to_host(g_stats), label);
        check_equal(cpu_sign, to_host(g_sign), label + " signs");
      }
    }
  });
}

// The fused decay and statistics walk each block on one thread as the CPU does: theta, the kept
// values, the statistics and the new signs are equal bit for bit.
TEST_CASE("keep_and_decay_at and decay_update_statistics match the CPU bit for bit") {
  std::uint32_t seed = 760;
  for_each_small_case([&](Family family, std::size_t n) {
    const std::string what = case_name(family, n);
    const std::vector<float> theta = make_values(family, n, ++seed);
    std::vector<std::uint32_t> stepped;
    std::vector<std::int8_t> sign(n);
    for (std::size_t j = 0; j < n; ++j) {
      if (scape::rng::derive(seed, j) % 10 == 0) stepped.push_back(static_cast<std::uint32_t>(j));
      sign[j] = static_cast<std::int8_t>(static_cast<int>(scape::rng::derive(seed + 1, j) % 3) - 1);
    }
    std::vector<std::uint64_t> ends;
    std::vector<float> factors;
    for (std::size_t end = 0; end < n;) {
      end = std::min(n, end + 1 + scape::rng::derive(seed + 2, ends.size()) % 5000);
      ends.push_back(end);
      factors.push_back(ends.size() % 2 == 0 ? 0.999f : 1.0f);
    }
    std::vector<float> cpu = theta, cpu_kept(stepped.size());
    sk::keep_and_decay_at(cpu, stepped, ends, factors, cpu_kept);
    const sk::Buffer<std::uint32_t> g_stepped = to_gpu(stepped);
    const sk::Buffer<std::uint64_t> g_ends = to_gpu(ends);
    const sk::Buffer<float> g_factors = to_gpu(factors);
    sk::Buffer<float> g_theta = to_gpu(theta), g_kept(gpu(), stepped.size());
    gpu().keep_and_decay_at(g_theta, g_stepped, g_ends, g_factors, g_kept);
    check_equal(cpu, to_host(g_theta), "keep_and_decay_at " + what);
    check_equal(cpu_kept, to_host(g_kept), "keep_and_decay_at kept " + what);
    for (const std::size_t block : {std::size_t{1}, std::size_t{100}, std::size_t{8192}}) {
      std::vector<float> cpu_theta = cpu;
      std::vector<std::int8_t> cpu_sign = sign;
      std::vector<double> cpu_stats(sk::kUpdateStats * ((n + block - 1) / block));
      sk::decay_update_statistics(cpu_theta, ends, factors, stepped, cpu_kept, true, cpu_sign, block, cpu_stats);
      sk::Buffer<float> g_after = to_gpu(cpu);
      sk::Buffer<std::int8_t> g_sign = to_gpu(sign);
      sk::Buffer<double> g_stats(gpu(), cpu_stats.size());
      gpu().decay_update_statistics(g_after, g_ends, g_factors, g_stepped, to_gpu(cpu_kept), true, g_sign, block,
                                    g_stats);
      const std::string label = "decay_update_statistics " + what + " block=" + std::to_string(block);
      check_equal(cpu_theta, to_host(g_after), label + " theta");
      check_equal(cpu_stats, to_host(g_stats), label);
      check_equal(cpu_sign, to_host(g_sign), label + " signs");
    }
  });
}
