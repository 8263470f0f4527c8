// The model ops of kernels/cuda (GEMM, norms, attention, activations, the loss) against the
// CPU backend, and CudaBackend through the KernelBackend interface (Buffers, copies, zero-fill,
// pointer access, the ChunkCopier round trip).
// Why bit for bit, and the input families: tests/test_cuda_kernels.cpp's header; without a
// visible device the program prints why and exits 77 (ctest: skipped).
#include <doctest/doctest.h>

#include "kernels/cpu/model_ops.hpp"

#include "cuda_compare.hpp"

using namespace scape::testing;

// ---- model ops ----------------------------------------------------------------------------
// The same inputs through the CPU backend and the CUDA backend. Bias, residual and embedding
// ops are compared bit for bit (no transcendental functions, the CPU's order of additions);
// GEMM-based ops, norms, attention, the loss and the activations (tanhf/expf differ from the
// CPU's by an ulp or two) within a relative tolerance: |cpu - cuda| <= tol (|cpu| + mean |cpu|),
// the mean taken over the whole output so that entries near zero by cancellation do not fail.

namespace {

constexpr double kModelTol = 1e-5;

void check_close(const std::vector<float>& cpu, const std::vector<float>& cuda, double tol, const std::string& what) {
  REQUIRE_MESSAGE(cpu.size() == cuda.size(), what);
  double mean_abs = 0;
  for (const float v : cpu) mean_abs += std::abs(static_cast<double>(v));
  mean_abs /= std::max<std::size_t>(cpu.size(), 1);
  std::size_t differ = 0, first = 0;
  for (std::size_t j = 0; j < cpu.size(); ++j) {
    const double ref = cpu[j];
    if (!(std::abs(ref - cuda[j]) <= tol * (std::abs(ref) + mean_abs))) {
      if (differ++ == 0) first = j;
    }
  }
  if (differ != 0) {
    FAIL_CHECK(what << ": " << differ << " of " << cpu.size() << " entries differ beyond " << tol << ", first at "
                    << first << " (cpu " << cpu[first] << ", cuda " << cuda[first] << ")");
  }
}

std::vector<float> model_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::vector<float> x = make_values(Family::normal, n, seed);
  for (float& v : x) v *= scale;
  return x;
}

std::vector<std::int32_t> model_tokens(std::size_t n, int vocab, std::uint32_t seed) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(scape::rng::derive(seed, i) % vocab);
  return t;
}

sk::KernelBackend& host_backend() { return sk::cpu_backend(); }

}  // namespace

// gemm_bf16's products of the same bf16 operands are exact on both devices; only the order of
// the fp32 sums differs, so both GEMMs share one tolerance.
TEST_CASE("gemm (cuBLAS, TF32 off) and gemm_bf16 (GemmEx) match the CPU within 1e-5 in every transpose combination") {
  struct Shape {
    int M, N, K;
  };
  for (const bool bf16 : {false, true}) {
    for (const Shape s : {Shape{1, 1, 1}, Shape{3, 5, 7}, Shape{64, 96, 128}, Shape{257, 65, 300}}) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          for (const bool acc : {false, true}) {
            const std::string what = std::string(bf16 ? "gemm_bf16 " : "gemm ") + std::to_string(s.M) + "x" +
                                     std::to_string(s.N) + "x" + std::to_string(s.K) + (ta ? " A^T" : "") +
                                     (tb ? " B^T" : "") + (acc ? " +=" : "");
            const auto a = model_values(std::size_t(s.M) * s.K, 801), b = model_values(std::size_t(s.K) * s.N, 802);
            auto c = model_values(std::size_t(s.M) * s.N, 803);
            sk::Buffer<float> gc = to_gpu(c);
            if (bf16) {
              gpu().gemm_bf16(ta, tb, s.M, s.N, s.K, to_gpu(a), to_gpu(b), acc, gc);
              host_backend().gemm_bf16(ta, tb, s.M, s.N, s.K, a, b, acc, c);
            } else {
              gpu().gemm(ta, tb, s.M, s.N, s.K, to_gpu(a), to_gpu(b), acc, gc);
              host_backend().gemm(ta, tb, s.M, s.N, s.K, a, b, acc, c);
            }
            check_close(c, to_host(gc), kModelTol, what);
          }
        }
      }
    }
  }
}

// TF32 rounds each input to 10 mantissa bits (relative 2^-11): a K = 512 product of normals then
// differs from fp32 by ~1e-3 of its size, more than fp32's 1e-5 and well within 1e-2.
TEST_CASE("set_cuda_tf32 switches the GEMMs to TF32 and back to bit-identical fp32") {
  const int M = 256, N = 256, K = 512;
  const auto a = model_values(std::size_t(M) * K, 804), b = model_values(std::size_t(K) * N, 805);
  std::vector<float> c(std::size_t(M) * N);
  host_backend().gemm(false, false, M, N, K, a, b, false, c);
  const sk::Buffer<float> ga = to_gpu(a), gb = to_gpu(b);
  sk::Buffer<float> gc(gpu(), c.size());
  REQUIRE_FALSE(sk::cuda_tf32());
  gpu().gemm(false, false, M, N, K, ga, gb, false, gc);
  const std::vector<float> fp32 = to_host(gc);
  check_close(c, fp32, kModelTol, "gemm fp32");

  sk::set_cuda_tf32(true);
  CHECK(sk::cuda_tf32());
  gpu().gemm(false, false, M, N, K, ga, gb, false, gc);
  const std::vector<float> tf32 = to_host(gc);
  sk::set_cuda_tf32(false);
  check_close(c, tf32, 1e-2, "gemm tf32");
  std::size_t beyond_fp32 = 0;
  for (std::size_t j = 0; j < c.size(); ++j) beyond_fp32 += std::abs(tf32[j] - c[j]) > kModelTol * std::abs(c[j]);
  CHECK_MESSAGE(beyond_fp32 > c.size() / 2, "TF32 on, yet only " << beyond_fp32 << " of " << c.size()
                                                                 << " entries left fp32's 1e-5: cuBLAS ran in fp32");

  CHECK_FALSE(sk::cuda_tf32());
  gpu().gemm(false, false, M, N, K, ga, gb, false, gc);
  check_equal(fp32, to_host(gc), "gemm fp32 after TF32 was turned off");
}

TEST_CASE("bias, residual add and embedding match the CPU bit for bit; their backwards too") {
  const int B = 3, T = 17, C = 40, V = 11, N = B * T;
  const auto x = model_values(std::size_t(N) * C, 811), bias = model_values(C, 812);
  std::vector<float> out(x.size());
  sk::Buffer<float> gout(gpu(), x.size());
  host_backend().bias_forward(out, x, bias, N, C);
  gpu().bias_forward(gout, to_gpu(x), to_gpu(bias), N, C);
  check_equal(out, to_host(gout), "bias_forward");
  auto db = model_values(C, 813);
  sk::Buffer<float> gdb = to_gpu(db);
  host_backend().bias_backward(db, x, N, C);
  gpu().bias_backward(gdb, to_gpu(x), N, C);
  check_equal(db, to_host(gdb), "bias_backward");
  host_backend().residual_add(x, out, out);
  gpu().residual_add(to_gpu(x), gout, gout);
  check_equal(out, to_host(gout), "residual_add");

  const auto wte = model_values(std::size_t(V) * C, 814), wpe = model_values(std::size_t(T) * C, 815);
  const auto tokens = model_tokens(N, V, 816);
  const sk::Buffer<std::int32_t> gtokens = to_gpu(tokens);
  host_backend().embedding_forward(out, wte, wpe, tokens, B, T, C);
  gpu().embedding_forward(gout, to_gpu(wte), to_gpu(wpe), gtokens, B, T, C);
  check_equal(out, to_host(gout), "embedding_forward");
  auto dwte = model_values(wte.size(), 817), dwpe = model_values(wpe.size(), 818);
  sk::Buffer<float> gdwte = to_gpu(dwte), gdwpe = to_gpu(dwpe);
  host_backend().embedding_backward(dwte, dwpe, x, tokens, B, T, C);
  gpu().embedding_backward(gdwte, gdwpe, to_gpu(x), gtokens, B, T, C);
  check_equal(dwte, to_host(gdwte), "embedding_backward wte");
  check_equal(dwpe, to_host(gdwpe), "embedding_backward wpe");
}

TEST_CASE("LayerNorm and RMSNorm, forward and backward, match the CPU within 1e-5") {
  for (const int C : {1, 40, 768}) {
    const int N = 37;
    const std::string what = " C=" + std::to_string(C);
    const auto x = model_values(std::size_t(N) * C, 821, 3.0f), w = model_values(C, 822), b = model_values(C, 823);
    const auto dy = model_values(x.size(), 824);
    std::vector<float> out(x.size()), mean(N), rstd(N);
    sk::Buffer<float> gout(gpu(), x.size()), gmean(gpu(), N), grstd(gpu(), N);
    const sk::Buffer<float> gx = to_gpu(x), gw = to_gpu(w), gb = to_gpu(b), gdy = to_gpu(dy);
    host_backend().layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-5);
    gpu().layernorm_forward(gout, gmean, grstd, gx, gw, gb, N, C, 1e-5);
    check_close(out, to_host(gout), kModelTol, "layernorm_forward" + what);
    check_close(rstd, to_host(grstd), kModelTol, "layernorm rstd" + what);
    auto dx = model_values(x.size(), 825), dw = model_values(C, 826), dbias = model_values(C, 827);
    sk::Buffer<float> gdx = to_gpu(dx), gdw = to_gpu(dw), gdb = to_gpu(dbias);
    // Both sides from the CPU's statistics, so the comparison isolates the backward.
    const sk::Buffer<float> cmean = to_gpu(mean), crstd = to_gpu(rstd);
    host_backend().layernorm_backward(dx, dw, dbias, dy, x, w, mean, rstd, N, C);
    gpu().layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, cmean, crstd, N, C);
    check_close(dx, to_host(gdx), kModelTol, "layernorm_backward dx" + what);
    check_close(dw, to_host(gdw), kModelTol, "layernorm_backward dw" + what);
    check_close(dbias, to_host(gdb), kModelTol, "layernorm_backward db" + what);

    host_backend().rmsnorm_forward(out, rstd, x, w, N, C, 1e-6);
    gpu().rmsnorm_forward(gout, grstd, gx, gw, N, C, 1e-6);
    check_close(out, to_host(gout), kModelTol, "rmsnorm_forward" + what);
    const sk::Buffer<float> crrms = to_gpu(rstd);
    host_backend().rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
    gpu().rmsnorm_backward(gdx, gdw, gdy, gx, gw, crrms, N, C);
    check_close(dx, to_host(gdx), kModelTol, "rmsnorm_backward dx" + what);
    check_close(dw, to_host(gdw), kModelTol, "rmsnorm_backward dw" + what);
  }
}

TEST_CASE("RoPE, GELU and SwiGLU, forward and backward, match the CPU within 1e-5") {
  const int N = 2 * 33, T = 33, stride = 5 * 16, width = 3 * 16, hd = 16;
  auto x = model_values(std::size_t(N) * stride, 831);
  sk::Buffer<float> gx = to_gpu(x);
  host_backend().rope_forward(x, N, T, stride, width, hd, 10000.0);
  gpu().rope_forward(gx, N, T, stride, width, hd, 10000.0);
  check_close(x, to_host(gx), kModelTol, "rope_forward");
  host_backend().rope_backward(x, N, T, stride, width, hd, 500000.0);
  gpu().rope_backward(gx, N, T, stride, width, hd, 500000.0);
  check_close(x, to_host(gx), kModelTol, "rope_backward");

  const auto in = model_values(70'001, 832, 3.0f);
  std::vector<float> out(in.size());
  sk::Buffer<float> gout(gpu(), in.size());
  const sk::Buffer<float> gin = to_gpu(in);
  host_backend().gelu_forward(out, in);
  gpu().gelu_forward(gout, gin);
  check_close(out, to_host(gout), kModelTol, "gelu_forward");
  auto d = model_values(in.size(), 833);
  sk::Buffer<float> gd = to_gpu(d);
  host_backend().gelu_backward(d, in);
  gpu().gelu_backward(gd, gin);
  check_close(d, to_host(gd), kModelTol, "gelu_backward");

  const int rows = 101, H = 96;
  const auto gate_up = model_values(std::size_t(rows) * 2 * H, 834, 3.0f),
             dout = model_values(std::size_t(rows) * H, 835);
  std::vector<float> s(dout.size()), ds(gate_up.size());
  sk::Buffer<float> gs(gpu(), s.size()), gds(gpu(), ds.size());
  const sk::Buffer<float> ggu = to_gpu(gate_up);
  host_backend().swiglu_forward(s, gate_up, rows, H);
  gpu().swiglu_forward(gs, ggu, rows, H);
  check_close(s, to_host(gs), kModelTol, "swiglu_forward");
  host_backend().swiglu_backward(ds, dout, gate_up, rows, H);
  gpu().swiglu_backward(gds, to_gpu(dout), ggu, rows, H);
  check_close(ds, to_host(gds), kModelTol, "swiglu_backward");
}

// The lower triangle (keys 0..t of each row t) of each T x T block of a [B H T T] buffer, row
// by row: the part of att the contract defines.
std::vector<float> lower_triangles(const std::vector<float>& att, int T) {
  std::vector<float> lower;
  const std::size_t TT = std::size_t(T) * T;
  for (std::size_t block = 0; block < att.size() / TT; ++block) {
    for (int t = 0; t < T; ++t) {
      const auto row = att.begin() + static_cast<std::ptrdiff_t>(block * TT + std::size_t(t) * T);
      lower.insert(lower.end(), row, row + t + 1);
    }
  }
  return lower;
}

// att with every entry above the diagonals set to NaN: a kernel that reads one (even to
// multiply it by 0) spreads the NaN into its output.
std::vector<float> with_nan_upper(std::vector<float> att, int T) {
  const std::size_t TT = std::size_t(T) * T;
  for (std::size_t e = 0; e < att.size(); ++e) {
    if (e % T > e % TT / T) att[e] = std::numeric_limits<float>::quiet_NaN();
  }
  return att;
}

// Worst |x - ref| / (|ref| + mean |ref|) over the entries: check_close's measure.
double worst_relative_error(const std::vector<double>& ref, const std::vector<float>& x) {
  double mean_abs = 0;
  for (const double v : ref) mean_abs += std::abs(v);
  mean_abs /= std::max<std::size_t>(ref.size(), 1);
  double worst = 0;
  for (std::size_t j = 0; j < ref.size(); ++j) {
    const double error = std::abs(x[j] - ref[j]) / (std::abs(ref[j]) + mean_abs);
    if (std::isnan(error)) return error;  // fails the caller's <= check
    worst = std::max(worst, error);
  }
  return worst;
}

// How attention_backward's dqkv is judged. cpu_float: within 1e-5 of the CPU's floats.
// exact_sums: against the CPU code run in double on the same inputs and probabilities, within
// 1e-5 or at most twice the CPU floats' own worst error. The second is for long sequences:
// dk and dv of early positions sum over all later queries, starting with O(1) terms (A[0, 0]
// = 1) that cancel to ~1e-2, so fp32 rounding alone puts either device ~1e-5 off there (in an
// emulation of the tiled kernels on these inputs at T = 1024, the CPU floats were 5.6e-5 from
// the double result and the tiled kernels 1.8e-5).
enum class BackwardCheck { cpu_float, exact_sums };

// Forward and backward of one shape on both devices. The GPU's att and datt start as NaN and
// its backward reads the CPU's probabilities with NaN above the diagonal, so reading the upper
// triangle fails the comparison.
void compare_attention(const sk::AttentionShape& s, const std::string& what, BackwardCheck backward_check) {
  const std::size_t N = std::size_t(s.B) * s.T, att_size = std::size_t(s.B) * s.H * s.T * s.T;
  const auto qkv = model_values(N * s.qkv_width(), 841, 0.5f), dy = model_values(N * s.y_width(), 842);
  const std::vector<float> nan_att(att_size, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> y(dy.size()), att(att_size), dqkv(qkv.size()), datt(att_size);
  sk::Buffer<float> gy(gpu(), y.size()), gatt = to_gpu(nan_att), gdqkv(gpu(), qkv.size()), gdatt = to_gpu(nan_att);
  const sk::Buffer<float> gqkv = to_gpu(qkv);
  host_backend().attention_forward(y, att, qkv, s);
  gpu().attention_forward(gy, gatt, gqkv, s);
  check_close(y, to_host(gy), kModelTol, "attention_forward" + what);
  check_close(lower_triangles(att, s.T), lower_triangles(to_host(gatt), s.T), kModelTol, "attention probs" + what);
  const sk::Buffer<float> catt = to_gpu(with_nan_upper(att, s.T));  // the CPU's probabilities on both sides
  host_backend().attention_backward(dqkv, datt, dy, att, qkv, s);
  gpu().attention_backward(gdqkv, gdatt, to_gpu(dy), catt, gqkv, s);
  if (backward_check == BackwardCheck::cpu_float) {
    check_close(dqkv, to_host(gdqkv), kModelTol, "attention_backward" + what);
    return;
  }
  const std::vector<double> qkv_d(qkv.begin(), qkv.end()), dy_d(dy.begin(), dy.end()), att_d(att.begin(), att.end());
  std::vector<double> dqkv_d(qkv.size()), datt_d(att_size);
  sk::CpuModelOps<double>{}.attention_backward(dqkv_d, datt_d, dy_d, att_d, qkv_d, s);
  const double cpu_error = worst_relative_error(dqkv_d, dqkv);
  const double gpu_error = worst_relative_error(dqkv_d, to_host(gdqkv));
  CHECK_MESSAGE(gpu_error <= std::max(kModelTol, 2 * cpu_error),
                "attention_backward" << what << ": worst error against double " << gpu_error << " (cpu floats "
                                     << cpu_error << ")");
}

std::string attention_name(const sk::AttentionShape& s) {
  return " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " Hkv=" + std::to_string(s.Hkv) + " hs=" + std::to_string(s.hs);
}

TEST_CASE("causal attention (multi-head and grouped-query), forward and backward, matches the CPU within 1e-5") {
  for (const int Hkv : {4, 2, 1}) {
    for (const int T : {1, 7, 64}) {
      const sk::AttentionShape s{.B = 2, .T = T, .H = 4, .Hkv = Hkv, .hs = 16};
      compare_attention(s, attention_name(s), BackwardCheck::cpu_float);
    }
  }
}

// The CUDA attention works in 64 x 64 output tiles over slices of 16: T and hs just around a
// tile edge, hs not a multiple of 16 or 32, several column tiles of hs (the last one partial),
// T = 1 and T = 1024, and GQA groups of 2, 3 and 4. The forward within 1e-5 of the CPU, the
// backward as exact_sums says.
TEST_CASE(
    "tiled causal attention at tile edges and long sequences: forward within 1e-5 of the CPU, backward of "
    "the exact sums") {
  const sk::AttentionShape shapes[] = {
      {.B = 1, .T = 1, .H = 4, .Hkv = 2, .hs = 24},    {.B = 1, .T = 63, .H = 2, .Hkv = 1, .hs = 8},
      {.B = 2, .T = 65, .H = 4, .Hkv = 1, .hs = 24},   {.B = 1, .T = 128, .H = 2, .Hkv = 2, .hs = 17},
      {.B = 1, .T = 129, .H = 2, .Hkv = 1, .hs = 72},  {.B = 3, .T = 17, .H = 6, .Hkv = 2, .hs = 16},
      {.B = 1, .T = 200, .H = 4, .Hkv = 2, .hs = 128}, {.B = 1, .T = 1000, .H = 4, .Hkv = 1, .hs = 24},
      {.B = 1, .T = 1024, .H = 2, .Hkv = 1, .hs = 64},
  };
  for (const auto& s : shapes) compare_attention(s, attention_name(s), BackwardCheck::exact_sums);
}

TEST_CASE("softmax cross-entropy and its gradient match the CPU within 1e-5") {
  for (const int V : {2, 256, 50257}) {
    const int N = 19;
    const std::string what = " V=" + std::to_string(V);
    auto logits = model_values(std::size_t(N) * V, 851, 4.0f);
    const auto targets = model_tokens(N, V, 852);
    std::vector<float> rows(N);
    sk::Buffer<float> glogits = to_gpu(logits), grows(gpu(), N);
    const sk::Buffer<std::int32_t> gtargets = to_gpu(targets);
    const double gpu_loss = gpu().cross_entropy(glogits, grows, gtargets, N, V, true);
    const double cpu_loss = host_backend().cross_entropy(logits, rows, targets, N, V, true);
    CHECK_MESSAGE(std::abs(cpu_loss - gpu_loss) <= kModelTol * std::abs(cpu_loss), "cross_entropy" << what);
    check_close(rows, to_host(grows), kModelTol, "cross_entropy rows" + what);
    check_close(logits, to_host(glogits), kModelTol, "cross_entropy gradient" + what);
  }
}

TEST_CASE("model ops check sizes before launching") {
  sk::Buffer<float> a(gpu(), 10), b(gpu(), 11);
  CHECK_THROWS_AS(gpu().gemm(false, false, 2, 5, 5, a, b, false, a), std::invalid_argument);
  CHECK_THROWS_AS(gpu().residual_add(a, b, a), std::invalid_argument);
  CHECK_THROWS_AS(gpu().rope_forward(a, 1, 1, 10, 6, 3, 10000.0), std::invalid_argument);
  const sk::AttentionShape bad{.B = 1, .T = 2, .H = 3, .Hkv = 2, .hs = 1};
  CHECK_THROWS_AS(gpu().attention_forward(a, b, a, bad), std::invalid_argument);
  gpu().synchronize();
}

// ---- the backend ------------------------------------------------------------------------

TEST_CASE("CudaBackend: description, Buffers, copies, zero-fill and pointer access") {
  sk::KernelBackend& b = gpu();
  CHECK(b.kind() == sk::DeviceKind::cuda);
  CHECK(b.description().rfind("cuda: ", 0) == 0);
  MESSAGE(b.description());

  std::vector<float> host(1000);
  for (std::size_t j = 0; j < host.size(); ++j) host[j] = static_cast<float>(j) * 0.5f;
  sk::Buffer<float> buf = to_gpu(host);
  CHECK(b.can_access(buf.data()));
  CHECK_FALSE(b.can_access(host.data()));
  // New Buffers are zero; resize keeps the old entries and zeroes the new ones.
  sk::Buffer<float> fresh(b, 77);
  CHECK(to_host(fresh) == std::vector<float>(77, 0.0f));
  buf.resize(3000);
  std::vector<float> expect = host;
  expect.resize(3000, 0.0f);
  CHECK(to_host(buf) == expect);
  buf.resize(10);
  buf.resize(20);  // within capacity: entries 10..19 are zeroed again
  expect.assign(host.begin(), host.begin() + 10);
  expect.resize(20, 0.0f);
  CHECK(to_host(buf) == expect);
  b.zero_bytes(buf.data() + 2, 3 * sizeof(float));
  expect[2] = expect[3] = expect[4] = 0.0f;
  CHECK(to_host(buf) == expect);
  sk::Buffer<float> other(b, 20);
  b.copy_bytes(buf.data(), other.data(), 20 * sizeof(float));
  CHECK(to_host(other) == expect);
  // Host access to managed memory after synchronize().
  b.synchronize();
  CHECK(buf.data()[1] == 0.5f);

  float* pinned = static_cast<float*>(b.allocate_pinned_host(64 * sizeof(float)));
  CHECK_FALSE(b.can_access(pinned));
  b.deallocate_pinned_host(pinned);
}

TEST_CASE("CudaChunkCopier round trip: upload, kernel on the slot, download, release") {
  sk::KernelBackend& b = gpu();
  constexpr std::size_t kChunk = 1000;
  constexpr std::size_t kTotal = 10'500;  // ten full chunks and a partial one
  auto copier = b.make_chunk_copier(kChunk);
  CHECK(copier->chunk_elements() == kChunk);
  CHECK(copier->device_bytes() == 2 * kChunk * sizeof(float));
  auto* host = static_cast<float*>(b.allocate_pinned_host(kTotal * sizeof(float)));
  for (std::size_t j = 0; j < kTotal; ++j) host[j] = static_cast<float>(j);

  // Every chunk doubled on the device and copied back, double-buffered through slots 0 and 1.
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t c = 0, first = 0; first < kTotal; ++c, first += kChunk) {
      const int s = static_cast<int>(c % 2);
      const std::size_t n = std::min(kChunk, kTotal - first);
      copier->upload(s, host + first, n);
      copier->wait_upload(s);
      b.scale(copier->slot(s).first(n), 2.0f);
      copier->download(s, host + first, n);
    }
    copier->finish();
  }
  bool all = true;
  for (std::size_t j = 0; j < kTotal; ++j) all = all && host[j] == 4.0f * static_cast<float>(j);
  CHECK(all);

  // release(): the slot is reused without a copy back; the host array keeps its values.
  copier->upload(0, host, kChunk);
  copier->wait_upload(0);
  std::vector<float> out(kChunk);
  b.copy_bytes(copier->slot(0).data(), out.data(), kChunk * sizeof(float));
  copier->release(0);
  copier->upload(0, host + kChunk, kChunk);
  copier->wait_upload(0);
  copier->finish();
  b.synchronize();
  CHECK(out[5] == host[5]);
  std::vector<float> second(kChunk);
  b.copy_bytes(copier->slot(0).data(), second.data(), kChunk * sizeof(float));
  b.synchronize();
  CHECK(second[5] == host[kChunk + 5]);
  copier.reset();
  b.deallocate_pinned_host(host);
}
