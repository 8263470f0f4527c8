// The SCAPE passes, the compressors' kernels (1-bit Adam, PowerSGD, DeMo), the payload, bitmask
// and compaction kernels of kernels/cuda against kernels/cpu, bit for bit; the size checks.
// Why bit for bit, and the input families: tests/test_cuda_kernels.cpp's header; without a
// visible device the program prints why and exits 77 (ctest: skipped).
#include <doctest/doctest.h>

#include "cuda_compare.hpp"

using namespace scape::testing;

// ---- SCAPE passes ---------------------------------------------------------------------------

TEST_CASE("first_moment_statistic, its carried form and random_statistic match the CPU") {
  std::uint32_t seed = 700;
  const float b1 = 0.9f, omb1 = static_cast<float>(1.0 - 0.9);
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{65}, std::size_t{1000}, std::size_t{300'007}, kLarge}) {
    const std::string what = "n=" + std::to_string(n);
    const std::vector<float> m = make_values(Family::normal, n, ++seed);
    const std::vector<float> a = make_values(Family::special, n, ++seed);
    std::vector<float> cpu(n);
    sk::first_moment_statistic(m, a, b1, omb1, cpu);
    const sk::Buffer<float> dm = to_gpu(m), da = to_gpu(a);
    sk::Buffer<float> out(gpu(), n);
    gpu().first_moment_statistic(dm, da, b1, omb1, out);
    check_equal(cpu, to_host(out), "first_moment_statistic " + what);

    const std::vector<float> q = make_values(Family::special, n, ++seed);
    std::vector<float> cpu_carried(n);
    sk::carried_first_moment_statistic(m, a, q, b1, cpu_carried);
    const sk::Buffer<float> dq = to_gpu(q);
    gpu().carried_first_moment_statistic(dm, da, dq, b1, out);
    check_equal(cpu_carried, to_host(out), "carried_first_moment_statistic " + what);

    // candidate_momentum in its three modes (m and g, g only, m only), with its non-finite count.
    const std::vector<float> e = make_values(Family::normal, n, ++seed);
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<float> cpu_e = e;
      const std::span<const float> mm = mode == 1 ? std::span<const float>{} : std::span<const float>(m);
      const std::span<const float> gg = mode == 2 ? std::span<const float>{} : std::span<const float>(a);
      const std::size_t cpu_bad = sk::candidate_momentum(cpu_e, mm, gg, b1, omb1);
      sk::Buffer<float> de = to_gpu(e);
      const std::size_t gpu_bad =
          gpu().candidate_momentum(de, mode == 1 ? std::span<const float>{} : std::span<const float>(dm),
                                   mode == 2 ? std::span<const float>{} : std::span<const float>(da), b1, omb1);
      check_equal(cpu_e, to_host(de), "candidate_momentum mode " + std::to_string(mode) + " " + what);
      CHECK(cpu_bad == gpu_bad);
    }

    // carry_momentum_off_mask on a random mask (a quarter of the bits), from bit 0 and from bit
    // 37 (positions straddle mask words), with gamma 1 (no multiplication) and 0.7.
    for (const std::size_t first_bit : {std::size_t{0}, std::size_t{37}}) {
      std::vector<std::uint64_t> mask(sk::words_for(first_bit + n));
      for (std::size_t w = 0; w < mask.size(); ++w)
        mask[w] = scape::rng::derive(seed, w) & scape::rng::derive(seed + 7, w);
      for (const float gamma : {1.0f, 0.7f}) {
        std::vector<float> cpu_q = q, cpu_m = m;
        sk::carry_momentum_off_mask(cpu_q, cpu_m, mask, first_bit, b1, gamma);
        sk::Buffer<float> gq = to_gpu(q), gm = to_gpu(m);
        gpu().carry_momentum_off_mask(gq, gm, to_gpu(mask), first_bit, b1, gamma);
        const std::string label = "carry_momentum_off_mask first_bit=" + std::to_string(first_bit) +
                                  " gamma=" + std::to_string(gamma) + " " + what;
        check_equal(cpu_q, to_host(gq), label + " q");
        check_equal(cpu_m, to_host(gm), label + " m");
      }
    }

    // candidate_statistic_carry on the same masks, with g holding NaN and infinities (a).
    for (const std::size_t first_bit : {std::size_t{0}, std::size_t{37}}) {
      std::vector<std::uint64_t> mask(sk::words_for(first_bit + n));
      for (std::size_t w = 0; w < mask.size(); ++w)
        mask[w] = scape::rng::derive(seed, w) & scape::rng::derive(seed + 7, w);
      for (const float gamma : {1.0f, 0.7f}) {
        std::vector<float> cpu_e = e, cpu_q = q, cpu_m = m, cpu_s(n);
        const std::size_t cpu_bad =
            sk::candidate_statistic_carry(cpu_e, a, cpu_q, cpu_m, mask, first_bit, b1, omb1, gamma, cpu_s);
        sk::Buffer<float> ge = to_gpu(e), gq = to_gpu(q), gm = to_gpu(m), gs(gpu(), n);
        const std::size_t gpu_bad =
            gpu().candidate_statistic_carry(ge, da, gq, gm, to_gpu(mask), first_bit, b1, omb1, gamma, gs);
        const std::string label = "candidate_statistic_carry first_bit=" + std::to_string(first_bit) +
                                  " gamma=" + std::to_string(gamma) + " " + what;
        check_equal(cpu_e, to_host(ge), label + " e");
        check_equal(cpu_s, to_host(gs), label + " statistic");
        check_equal(cpu_q, to_host(gq), label + " q");
        check_equal(cpu_m, to_host(gm), label + " m");
        CHECK(cpu_bad == gpu_bad);
      }
    }

    // quantize_e5m2 at exponents that put the values in the normal range, at the top of it, and
    // among the subnormals.
    for (const int exponent : {-12, 0, 3, 16}) {
      std::vector<float> quantized(n), err(n);
      sk::quantize_e5m2(m, 3.0f, exponent, quantized, err);
      sk::Buffer<float> dquantized(gpu(), n), derr(gpu(), n);
      gpu().quantize_e5m2(dm, 3.0f, exponent, dquantized, derr);
      check_equal(quantized, to_host(dquantized), "quantize_e5m2 q exponent " + std::to_string(exponent) + " " + what);
      check_equal(err, to_host(derr), "quantize_e5m2 error exponent " + std::to_string(exponent) + " " + what);
    }

    const std::uint64_t key = 0x0123456789abcdefull + n;
    const std::uint64_t first = (std::uint64_t{1} << 40) + 17;
    sk::random_statistic(key, first, cpu);
    gpu().random_statistic(key, first, out);
    check_equal(cpu, to_host(out), "random_statistic " + what);
  }
}

TEST_CASE("sign_compress and sign_expand_add (1-bit Adam) match the CPU") {
  std::uint32_t seed = 900;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{65}, std::size_t{1000}, std::size_t{300'007}, kLarge}) {
    for (std::size_t chunk : {std::size_t{1}, std::size_t{64}, std::size_t{2048}}) {
      const std::string what = "n=" + std::to_string(n) + " chunk=" + std::to_string(chunk);
      std::vector<float> x = make_values(Family::special, n, ++seed);
      const std::vector<float> scales = make_values(Family::normal, (n + chunk - 1) / chunk, ++seed);
      std::vector<float> acc = make_values(Family::normal, n, ++seed);
      sk::Buffer<float> dx = to_gpu(x), dacc = to_gpu(acc);
      const sk::Buffer<float> dscales = to_gpu(scales);
      sk::Buffer<std::uint64_t> dwords(gpu(), sk::words_for(n));
      std::vector<std::uint64_t> words(sk::words_for(n));
      sk::sign_compress(x, chunk, scales, words);
      gpu().sign_compress(dx, chunk, dscales, dwords);
      check_equal(x, to_host(dx), "sign_compress error " + what);
      check_equal(words, to_host(dwords), "sign_compress words " + what);
      sk::sign_expand_add(words, chunk, scales, acc);
      gpu().sign_expand_add(dwords, chunk, dscales, dacc);
      check_equal(acc, to_host(dacc), "sign_expand_add " + what);
    }
  }
}

TEST_CASE("PowerSGD's low-rank kernels (project, project_t, residual, Gram-Schmidt) match the CPU") {
  std::uint32_t seed = 950;
  const std::size_t shapes[][3] = {{1, 1, 1}, {7, 3, 2}, {64, 65, 4}, {300, 1000, 8}, {1024, 4096, 4}};
  for (const auto& shape : shapes) {
    const std::size_t rows = shape[0], cols = shape[1], rank = shape[2];
    const std::string what = "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
    std::vector<float> m = make_values(Family::normal, rows * cols, ++seed);
    const std::vector<float> q = make_values(Family::normal, cols * rank, ++seed);
    std::vector<float> p(rows * rank), q2(cols * rank), approx(rows * cols);
    sk::Buffer<float> dm = to_gpu(m), dq = to_gpu(q), dp(gpu(), rows * rank), dq2(gpu(), cols * rank),
                      dapprox(gpu(), rows * cols);
    sk::lowrank_project(m, rows, cols, q, p);
    gpu().lowrank_project(dm, rows, cols, dq, dp);
    check_equal(p, to_host(dp), "lowrank_project " + what);
    sk::orthonormalize_columns(p, rows);
    gpu().orthonormalize_columns(dp, rows);
    check_equal(p, to_host(dp), "orthonormalize_columns " + what);
    sk::lowrank_project_t(m, rows, cols, p, q2);
    gpu().lowrank_project_t(dm, rows, cols, dp, dq2);
    check_equal(q2, to_host(dq2), "lowrank_project_t " + what);
    sk::lowrank_residual(m, rows, cols, p, q2, approx);
    gpu().lowrank_residual(dm, rows, cols, dp, dq2, dapprox);
    check_equal(approx, to_host(dapprox), "lowrank_residual approx " + what);
    check_equal(m, to_host(dm), "lowrank_residual error " + what);
  }
}

TEST_CASE("DeMo's kernels (chunk_transform, chunk_topk, sign_descent) match the CPU") {
  std::uint32_t seed = 970;
  for (const Family family : kFamilies) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{65}, std::size_t{1000}, std::size_t{300'007}}) {
      for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
        const std::string what = case_name(family, n) + " chunk=" + std::to_string(chunk);
        const std::vector<float> x = make_values(family, n, ++seed);
        const std::vector<float> basis = make_values(Family::normal, chunk * chunk, ++seed);
        const std::size_t whole = n - n % chunk;
        const std::vector<float> xw(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(whole));
        const sk::Buffer<float> dx = to_gpu(xw), dbasis = to_gpu(basis);
        for (bool transpose : {false, true}) {
          std::vector<float> y(whole);
          sk::Buffer<float> dy(gpu(), whole);
          sk::chunk_transform(xw, chunk, basis, transpose, y);
          gpu().chunk_transform(dx, chunk, dbasis, transpose, dy);
          check_equal(y, to_host(dy), "chunk_transform " + what);
        }
        for (std::size_t k : {std::size_t{1}, std::size_t{3}, chunk}) {
          const std::size_t count = sk::chunk_topk_count(n, chunk, k);
          std::vector<std::uint32_t> idx(count);
          std::vector<float> values(count);
          sk::Buffer<std::uint32_t> didx(gpu(), count);
          sk::Buffer<float> dvalues(gpu(), count);
          const sk::Buffer<float> dfull = to_gpu(x);
          sk::chunk_topk(x, chunk, k, idx, values);
          gpu().chunk_topk(dfull, chunk, k, didx, dvalues);
          check_equal(idx, to_host(didx), "chunk_topk indices " + what);
          check_equal(values, to_host(dvalues), "chunk_topk values " + what);
        }
      }
      std::vector<float> theta = make_values(Family::normal, n, ++seed);
      const std::vector<float> u = make_values(family, n, ++seed);
      sk::Buffer<float> dtheta = to_gpu(theta);
      const sk::Buffer<float> du = to_gpu(u);
      sk::sign_descent(theta, u, 0.01f);
      gpu().sign_descent(dtheta, du, 0.01f);
      check_equal(theta, to_host(dtheta), "sign_descent " + case_name(family, n));
    }
  }
}

TEST_CASE("pack_payload, rebase_indices, add_momentum, reconstruct_gradient and owner_payload_gradient match the CPU") {
  std::uint32_t seed = 800;
  const float b1 = 0.9f, omb1 = static_cast<float>(1.0 - 0.9);
  for (std::size_t n : {std::size_t{1}, std::size_t{65}, std::size_t{1000}, std::size_t{300'007}}) {
    const std::string what = "n=" + std::to_string(n);
    const std::vector<float> a = make_values(Family::normal, n, ++seed);
    const std::size_t m_offset = n / 4;
    const std::vector<float> m = make_values(Family::normal, n - m_offset, ++seed);
    // Indices within [m_offset, n), so the momentum range covers them.
    std::vector<std::uint32_t> idx;
    for (const std::uint32_t j : random_indices(n - m_offset, 0.2, ++seed))
      idx.push_back(j + static_cast<std::uint32_t>(m_offset));
    const std::size_t k = idx.size();
    const sk::Buffer<float> da = to_gpu(a), dm = to_gpu(m);
    const sk::Buffer<std::uint32_t> didx = to_gpu(idx);
    for (const bool with_momentum : {true, false}) {
      for (const bool two : {true, false}) {
        std::vector<float> b(k), a_out(two ? k : 0);
        sk::pack_payload(a, m, m_offset, idx, b1, omb1, with_momentum, b, a_out);
        sk::Buffer<float> db(gpu(), k), da_out(gpu(), two ? k : 0);
        gpu().pack_payload(da, dm, m_offset, didx, b1, omb1, with_momentum, db, da_out);
        check_equal(b, to_host(db), "pack_payload b " + what);
        check_equal(a_out, to_host(da_out), "pack_payload a_out " + what);
      }
    }
    std::vector<std::uint32_t> rebased(k);
    sk::rebase_indices(idx, static_cast<std::uint32_t>(m_offset), rebased);
    sk::Buffer<std::uint32_t> drebased(gpu(), k);
    gpu().rebase_indices(didx, static_cast<std::uint32_t>(m_offset), drebased);
    check_equal(rebased, to_host(drebased), "rebase_indices " + what);

    const std::vector<float> b_bar = make_values(Family::normal, k, ++seed);
    std::vector<float> cpu = b_bar;
    sk::add_momentum(cpu, m, rebased, b1);
    sk::Buffer<float> d = to_gpu(b_bar);
    gpu().add_momentum(d, dm, drebased, b1);
    check_equal(cpu, to_host(d), "add_momentum " + what);

    std::vector<float> g_bar(k);
    sk::reconstruct_gradient(b_bar, m, rebased, b1, omb1, g_bar);
    const sk::Buffer<float> dbb = to_gpu(b_bar);
    sk::Buffer<float> dg(gpu(), k);
    gpu().reconstruct_gradient(dbb, dm, drebased, b1, omb1, dg);
    check_equal(g_bar, to_host(dg), "reconstruct_gradient " + what);

    const std::vector<float> q = make_values(Family::normal, n - m_offset, ++seed);
    for (const bool with_q : {true, false}) {
      std::vector<float> owner_b = b_bar, owner_g(k), owner_q = q;
      const std::span<float> q_given = with_q ? std::span<float>(owner_q) : std::span<float>{};
      sk::owner_payload_gradient(owner_b, m, q_given, rebased, b1, omb1, owner_g);
      sk::Buffer<float> dob = to_gpu(b_bar), dog(gpu(), k), dq = to_gpu(q);
      const std::span<float> dq_given = with_q ? dq.span() : std::span<float>{};
      gpu().owner_payload_gradient(dob, dm, dq_given, drebased, b1, omb1, dog);
      check_equal(owner_b, to_host(dob), "owner_payload_gradient b_bar " + what);
      check_equal(owner_g, to_host(dog), "owner_payload_gradient g_bar " + what);
      check_equal(owner_q, to_host(dq), "owner_payload_gradient q " + what);
    }

    std::vector<float> m_clip(k);
    sk::momentum_from_gradient(m, rebased, g_bar, b1, omb1, m_clip);
    const sk::Buffer<float> dgb = to_gpu(g_bar);
    sk::Buffer<float> dmc(gpu(), k);
    gpu().momentum_from_gradient(dm, drebased, dgb, b1, omb1, dmc);
    check_equal(m_clip, to_host(dmc), "momentum_from_gradient " + what);
  }
}

// ---- bitmasks and compaction ----------------------------------------------------------------

TEST_CASE("pack_bits, unpack_bits and the popcounts match the CPU") {
  std::uint32_t seed = 900;
  for (const std::size_t n : small_sizes_and_large()) {
    const std::string what = "n=" + std::to_string(n);
    std::mt19937 rng(++seed);
    std::uniform_int_distribution<int> byte(0, 255);
    // One spare byte in front: flags at offset 1 are not 16-byte aligned (the kernel's slow path).
    std::vector<std::uint8_t> flags(n + 1);
    for (auto& f : flags) f = static_cast<std::uint8_t>(byte(rng) < 160 ? 0 : byte(rng));
    const sk::Buffer<std::uint8_t> dflags = to_gpu(flags);
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      const std::span<const std::uint8_t> in(flags.data() + offset, n);
      std::vector<std::uint64_t> cpu(sk::words_for(n));
      sk::pack_bits(in, cpu);
      sk::Buffer<std::uint64_t> words(gpu(), cpu.size());
      run_direct([&] { gk::pack_bits({dflags.data() + offset, n}, words); });
      const std::vector<std::uint64_t> got = to_host(words);
      check_equal(cpu, got, "pack_bits offset " + std::to_string(offset) + " " + what);

      std::vector<std::uint8_t> unpacked(n + 1, 7), expect(n + 1, 7);
      sk::unpack_bits(cpu, std::span<std::uint8_t>(expect.data() + offset, n));
      sk::Buffer<std::uint8_t> dunpacked = to_gpu(unpacked);
      run_direct([&] { gk::unpack_bits(words, {dunpacked.data() + offset, n}); });
      check_equal(expect, to_host(dunpacked), "unpack_bits offset " + std::to_string(offset) + " " + what);
    }
    std::vector<std::uint64_t> a(sk::words_for(n)), b(sk::words_for(n));
    for (auto& w : a) w = (std::uint64_t{rng()} << 32) | rng();
    for (auto& w : b) w = (std::uint64_t{rng()} << 32) | rng();
    const sk::Buffer<std::uint64_t> da = to_gpu(a), db = to_gpu(b);
    CHECK(gpu().popcount(da) == sk::popcount(a));
    gpu().synchronize();
    CHECK(gk::popcount_and(da, db) == sk::popcount_and(a, b));
    CHECK(gk::popcount_or(da, db) == sk::popcount_or(a, b));
  }
}

TEST_CASE("bits_to_indices and indices_to_bits match the CPU") {
  std::uint32_t seed = 1000;
  for (const std::size_t n : small_sizes_and_large()) {
    for (const double density : {0.0, 0.01, 0.5, 1.0}) {
      const std::string what = "n=" + std::to_string(n) + " density=" + std::to_string(density);
      const std::vector<std::uint32_t> idx = random_indices(n, density, ++seed);
      std::vector<std::uint64_t> words(sk::words_for(n));
      sk::indices_to_bits(idx, 0, words);
      const std::uint32_t base = 12345;
      std::vector<std::uint32_t> cpu(idx.size());
      const std::size_t count = sk::bits_to_indices(words, base, cpu);
      const sk::Buffer<std::uint64_t> dwords = to_gpu(words);
      sk::Buffer<std::uint32_t> out(gpu(), idx.size());
      CHECK(gpu().bits_to_indices(dwords, base, out) == count);
      check_equal(cpu, to_host(out), "bits_to_indices " + what);

      // indices_to_bits ORs into existing words.
      std::vector<std::uint64_t> pre(words.size());
      for (std::size_t w = 0; w < pre.size(); ++w) pre[w] = (w % 3 == 0) ? 0x8000000000000001ull : 0;
      std::vector<std::uint64_t> cpu_words = pre;
      sk::indices_to_bits(cpu, base, cpu_words);
      sk::Buffer<std::uint64_t> dpre = to_gpu(pre);
      gpu().indices_to_bits(out, base, dpre);
      check_equal(cpu_words, to_host(dpre), "indices_to_bits " + what);
    }
  }
  // The CPU's checks: out too small, index past uint32.
  std::vector<std::uint64_t> words = {0xffull, 0x1ull};
  const sk::Buffer<std::uint64_t> dwords = to_gpu(words);
  sk::Buffer<std::uint32_t> out(gpu(), 8);
  CHECK_THROWS_AS(gpu().bits_to_indices(dwords, 0, out), std::invalid_argument);
  sk::Buffer<std::uint32_t> enough(gpu(), 9);
  CHECK_THROWS_AS(gpu().bits_to_indices(dwords, std::numeric_limits<std::uint32_t>::max() - 10, enough),
                  std::invalid_argument);
  CHECK(gpu().bits_to_indices(dwords, 0, enough) == 9);
}

TEST_CASE("mask coding (and_not, extract, deposit, Elias-Fano) matches the CPU") {
  std::uint32_t seed = 1100;
  for (const std::size_t n : small_sizes_and_large()) {
    for (const double density : {0.0, 0.001, 0.01, 0.1, 1.0}) {
      const std::string what = "n=" + std::to_string(n) + " density=" + std::to_string(density);
      std::vector<std::uint64_t> cur(sk::words_for(n)), prev(sk::words_for(n));
      sk::indices_to_bits(random_indices(n, density, ++seed), 0, cur);
      sk::indices_to_bits(random_indices(n, density, ++seed), 0, prev);
      const sk::Buffer<std::uint64_t> dcur = to_gpu(cur), dprev = to_gpu(prev);

      std::vector<std::uint64_t> fresh(cur.size());
      sk::and_not_bits(cur, prev, fresh);
      sk::Buffer<std::uint64_t> dfresh(gpu(), cur.size());
      gpu().and_not_bits(dcur, dprev, dfresh);
      check_equal(fresh, to_host(dfresh), "and_not_bits " + what);

      std::vector<std::uint64_t> either = prev;
      sk::or_bits(cur, either);
      sk::Buffer<std::uint64_t> deither = to_gpu(prev);
      gpu().or_bits(dcur, deither);
      check_equal(either, to_host(deither), "or_bits " + what);

      const std::size_t kept_count = sk::popcount(prev);
      std::vector<std::uint64_t> kept(sk::words_for(kept_count));
      sk::extract_bits(cur, prev, kept);
      sk::Buffer<std::uint64_t> dkept(gpu(), kept.size());
      gpu().extract_bits(dcur, dprev, dkept);
      check_equal(kept, to_host(dkept), "extract_bits " + what);

      std::vector<std::uint64_t> deposited = fresh;
      sk::deposit_bits(kept, prev, deposited);
      CHECK_MESSAGE(deposited == cur, "deposit_bits restores the mask " << what);
      gpu().deposit_bits(dkept, dprev, dfresh);
      check_equal(deposited, to_host(dfresh), "deposit_bits " + what);

      const std::size_t k = sk::popcount(cur);
      std::vector<std::uint64_t> code(sk::ef_words(n, k));
      sk::ef_encode(cur, n, k, code);
      sk::Buffer<std::uint64_t> dcode(gpu(), code.size());
      gpu().ef_encode(dcur, n, k, dcode);
      check_equal(code, to_host(dcode), "ef_encode " + what);
      sk::Buffer<std::uint64_t> ddecoded(gpu(), cur.size());
      gpu().ef_decode(dcode, n, k, ddecoded);
      check_equal(cur, to_host(ddecoded), "ef_decode " + what);
      std::vector<std::uint32_t> indices(k);
      sk::ef_decode_indices(code, n, k, indices);
      sk::Buffer<std::uint32_t> dindices(gpu(), k);
      gpu().ef_decode_indices(dcode, n, k, dindices);
      check_equal(indices, to_host(dindices), "ef_decode_indices " + what);
    }
  }
  // The shared size checks.
  sk::Buffer<std::uint64_t> two(gpu(), 2), one(gpu(), 1);
  CHECK_THROWS_AS(gpu().and_not_bits(two, one, two), std::invalid_argument);
  CHECK_THROWS_AS(gpu().ef_encode(two, 128, 3, two), std::invalid_argument);
  CHECK_THROWS_AS(gpu().ef_decode(one, 128, 200, two), std::invalid_argument);
  sk::Buffer<std::uint32_t> three(gpu(), 3);
  CHECK_THROWS_AS(gpu().ef_decode_indices(one, 128, 2, three), std::invalid_argument);
}

TEST_CASE("compact, expand, zero_at and scatter_add match the CPU") {
  std::uint32_t seed = 1100;
  for (const std::size_t n : small_sizes_and_large()) {
    const std::string what = "n=" + std::to_string(n);
    const std::vector<float> src = make_values(Family::special, n, ++seed);
    const std::vector<std::uint32_t> idx = random_indices(n, 0.05, ++seed);
    const sk::Buffer<float> dsrc = to_gpu(src);
    const sk::Buffer<std::uint32_t> didx = to_gpu(idx);

    std::vector<float> cpu(idx.size());
    sk::compact(src, idx, cpu);
    sk::Buffer<float> dst(gpu(), idx.size());
    gpu().compact(dsrc, didx, dst);
    check_equal(cpu, to_host(dst), "compact " + what);

    std::vector<float> dense = make_values(Family::normal, n, ++seed);
    std::vector<float> cpu_dense = dense;
    sk::expand(cpu, idx, cpu_dense);
    sk::Buffer<float> ddense = to_gpu(dense);
    gpu().expand(dst, didx, ddense);
    check_equal(cpu_dense, to_host(ddense), "expand " + what);

    sk::zero_at(cpu_dense, idx);
    gpu().zero_at(ddense, didx);
    check_equal(cpu_dense, to_host(ddense), "zero_at " + what);

    // Two lists in turn, the second overlapping the first, as the top-k average adds them.
    const std::vector<std::uint32_t> idx2 = random_indices(n, 0.05, ++seed);
    const std::vector<float> src2 = make_values(Family::special, idx2.size(), ++seed);
    const sk::Buffer<std::uint32_t> didx2 = to_gpu(idx2);
    const sk::Buffer<float> dsrc2 = to_gpu(src2);
    sk::scatter_add(cpu_dense, idx, cpu);
    sk::scatter_add(cpu_dense, idx2, src2);
    gpu().scatter_add(ddense, didx, dst);
    gpu().scatter_add(ddense, didx2, dsrc2);
    check_equal(cpu_dense, to_host(ddense), "scatter_add " + what);
  }
  const sk::Buffer<float> src(gpu(), 10);
  const sk::Buffer<std::uint32_t> idx(gpu(), 3);
  sk::Buffer<float> dst(gpu(), 4);
  CHECK_THROWS_AS(gpu().compact(src, idx, dst), std::invalid_argument);
  CHECK_THROWS_AS(gpu().expand(dst, idx, dst), std::invalid_argument);
  CHECK_THROWS_AS(gpu().scatter_add(dst, idx, dst), std::invalid_argument);
}

TEST_CASE("size checks throw std::invalid_argument before launching") {
  sk::Buffer<float> a(gpu(), 10), b(gpu(), 11);
  CHECK_THROWS_AS(gpu().adamw_step(a, a, a, b, sk::AdamScalars{}), std::invalid_argument);
  CHECK_THROWS_AS(gpu().adams_step(a, b, a, sk::AdamScalars{}), std::invalid_argument);
  CHECK_THROWS_AS(gpu().accumulate(a, b), std::invalid_argument);
  CHECK_THROWS_AS(gpu().first_moment_statistic(a, b, 0.9f, 0.1f, a), std::invalid_argument);
  CHECK_THROWS_AS(gpu().round_to_bf16(a, b), std::invalid_argument);
  sk::Buffer<std::uint64_t> w1(gpu(), 1), w2(gpu(), 2);
  CHECK_THROWS_AS(gk::popcount_and(w1, w2), std::invalid_argument);
  sk::Buffer<std::uint8_t> flags(gpu(), 65);
  CHECK_THROWS_AS(gk::pack_bits(flags, w1), std::invalid_argument);
  gpu().synchronize();
}
