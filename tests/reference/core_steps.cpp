// The C++ core's side of the comparison with the numpy reference (tests/reference/README.md):
// runs SCAPE on W emulated workers over a recorded gradient trace and writes, step by step, what
// scape_reference.run_reference returns, so that test_core_vs_reference.py can compare the two.
//
//   core_steps DIR
// DIR/spec.json: {"workers": W, "steps": T, "optimizer": {...a run config's optimizer section...},
//                 "layout": [{"name": ..., "size": ..., "decay": ...}, ...]}
// DIR/theta0.f32 (N floats), DIR/grads.f32 (T x W x N floats, step-major), raw little-endian.
// Writes DIR/theta.f32 (T x N, worker 0), m.f32 (T x N, over the owners), residual.f32
// (T x W x N, each worker's e_i in the formulation's units, the momentum an owner carries
// included), mask.u8 (T x N). The optimizer section is parsed and validated as `scape run` does.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <vector>

#include "config/config.hpp"
#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "optimizers/make_optimizer.hpp"
#include "optimizers/scape/scape_optimizer.hpp"
#include "sim/emulated_comm.hpp"

namespace fs = std::filesystem;
using namespace scape;

namespace {

template <typename T>
std::vector<T> read_raw(const fs::path& path, std::size_t count) {
  std::vector<T> out(count);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * sizeof(T)))) {
    throw std::runtime_error(path.string() + ": expected " + std::to_string(count * sizeof(T)) + " bytes");
  }
  return out;
}

template <typename T>
void write_raw(const fs::path& path, const std::vector<T>& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(T)));
  if (!out) throw std::runtime_error(path.string() + ": write failed");
}

int run(const fs::path& dir) {
  const nlohmann::json spec = config::read_json_file(dir / "spec.json");
  const int workers = spec.at("workers").get<int>(), steps = spec.at("steps").get<int>();
  ParamLayout layout;
  for (const auto& t : spec.at("layout")) {
    layout.add(t.at("name").get<std::string>(), {t.at("size").get<std::size_t>()}, t.at("decay").get<bool>());
  }
  const std::size_t n = layout.size(), w_count = static_cast<std::size_t>(workers);
  const nlohmann::json config = {{"name", "core-steps"},
                                 {"workers", workers},
                                 {"steps", steps},
                                 {"model", {{"type", "quadratic"}, {"size", std::max<std::size_t>(n, 64)}}},
                                 {"optimizer", spec.at("optimizer")}};
  const OptimizerConfig optimizer = config::parse_experiment(config, dir).optimizer;
  const auto theta0 = read_raw<float>(dir / "theta0.f32", n);
  const auto grads = read_raw<float>(dir / "grads.f32", static_cast<std::size_t>(steps) * w_count * n);

  const std::size_t steps_n = static_cast<std::size_t>(steps);
  std::vector<float> theta_out(steps_n * n), m_out(steps_n * n, 0.0f), e_out(steps_n * w_count * n, 0.0f);
  std::vector<std::uint8_t> mask_out(steps_n * n);
  std::vector<std::vector<float>> carried(steps_n * w_count);
  const Sharding shards(n, workers);
  sim::run_ranks(workers, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(optimizer, layout, comm, steps);
    auto* core = dynamic_cast<ScapeOptimizer*>(opt.get());
    if (core == nullptr) throw std::invalid_argument("core_steps: optimizer.type must be scape");
    const auto w = static_cast<std::size_t>(comm.rank());
    std::vector<float> theta = theta0;
    for (std::size_t t = 0; t < steps_n; ++t) {
      const float* g = grads.data() + (t * w_count + w) * n;
      opt->step(theta, std::span<const float>(g, n));
      // Each rank writes only its own slots: its residual, its shard of m, its carried momentum.
      const auto e = opt->residual();
      std::copy(e.begin(), e.end(), e_out.begin() + static_cast<std::ptrdiff_t>((t * w_count + w) * n));
      const auto m = opt->own_first_moment();
      std::copy(m.begin(), m.end(), m_out.begin() + static_cast<std::ptrdiff_t>(t * n + shards.begin(comm.rank())));
      const auto q = core->carried_momentum();
      carried[t * w_count + w].assign(q.begin(), q.end());
      if (w == 0) {
        std::copy(theta.begin(), theta.end(), theta_out.begin() + static_cast<std::ptrdiff_t>(t * n));
        const auto mask = opt->mask();
        for (std::size_t j = 0; j < n; ++j) mask_out[t * n + j] = static_cast<std::uint8_t>((mask[j / 64] >> (j % 64)) & 1u);
      }
    }
    opt->finish();
  });
  // The momentum an owner carries belongs to every worker's residual over its shard (paper), or
  // to the owner's alone (artifact: its sharded ranks keep nothing outside their own shard).
  const bool owner_only = optimizer.scape.formulation == Formulation::artifact;
  for (std::size_t t = 0; t < steps_n; ++t) {
    for (std::size_t owner = 0; owner < w_count; ++owner) {
      const auto& q = carried[t * w_count + owner];
      const std::size_t lo = shards.begin(static_cast<int>(owner));
      for (std::size_t i = 0; i < w_count; ++i) {
        if (owner_only && i != owner) continue;
        float* e = e_out.data() + (t * w_count + i) * n + lo;
        for (std::size_t j = 0; j < q.size(); ++j) e[j] += q[j];
      }
    }
  }
  write_raw(dir / "theta.f32", theta_out);
  write_raw(dir / "m.f32", m_out);
  write_raw(dir / "residual.f32", e_out);
  write_raw(dir / "mask.u8", mask_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: core_steps DIR (tests/reference/core_steps.cpp says what DIR holds)\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "core_steps: " << e.what() << "\n";
    return 2;
  }
}
