// The host memory formula of a run (host_memory.hpp).
#include "train/host_memory.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "config/model_shapes.hpp"
#include "model/transformer.hpp"
#include "optimizers/device_state.hpp"
#include "run_file/trace.hpp"
#include "train/metric_table.hpp"

namespace scape::train {
namespace {

using Z = std::size_t;
constexpr Z kFloat = sizeof(float);
constexpr double kMiB = 1024.0 * 1024.0;

// Measured (tests/test_host_memory.cpp): the binary with its libraries (libstdc++, HDF5, OpenMP)
// and the run file's caches (20 MiB for a quadratic of 1000 at W = 1), and what one more worker
// thread touches (its stack and malloc arena: under 64 KiB at W = 64). A build linked with CUDA
// holds its runtime's libraries resident from the start, with or without a GPU: `scape validate`
// alone peaks at 221 MiB there against 14 MiB without (measured 2026-12-05).
#ifdef SCAPE_HAVE_CUDA
constexpr Z kProgram = (20 + 207) * 1024 * 1024;
#else
constexpr Z kProgram = 20 * 1024 * 1024;
#endif
constexpr Z kPerThread = 64 * 1024;

Z size_of_file(const std::filesystem::path& p) {
  std::error_code ec;
  const auto s = std::filesystem::file_size(p, ec);
  return ec ? 0 : static_cast<Z>(s);
}

// The corpus at its peak while it loads: the tokens (uint16) and their train/validation copies,
// with the file's bytes for text (read as bytes, widened) and token files (read, decoded).
Z data_bytes(const config::ExperimentConfig& c) {
  if (c.has_data()) {
    const auto& d = c.data;
    if (d.type == "synthetic") return 2 * sizeof(std::uint16_t) * static_cast<Z>(d.tokens);
    if (d.type == "text") return 5 * size_of_file(d.path);  // bytes, tokens, split
    return 2 * size_of_file(d.path);                        // bytes and tokens, then tokens and split
  }
  if (c.model.type == "quadratic") return 2 * kFloat * static_cast<Z>(c.model.size);  // curvature, optimum
  return 0;  // replay reads each step's gradient from the trace as it goes
}

// Parameters of the model: a language model's from its shape (unbounded, so a model past the
// layout's 2^32 elements still counts), the quadratic's size, a trace's layout.
Z parameter_count(const config::ExperimentConfig& c) {
  if (c.has_data()) {
    return model::transformer_layout(config::language_model_spec(c.model).shape(), ParamLayout::kUnbounded).size();
  }
  if (c.model.type == "quadratic") return static_cast<Z>(c.model.size);
  if (c.model.type == "replay") {
    try {
      const run_file::GradientTrace trace(c.model.path);
      Z n = 0;
      for (const Z s : trace.sizes()) n += s;
      return n;
    } catch (const std::exception&) {
      return 0;  // the run's own load names the file and the problem
    }
  }
  return 0;
}

// Floats per parameter beyond the moments for the methods without a buffer-by-buffer count
// (optimizers/device_state.cpp counts SCAPE, AdamW, AdamS and DiLoCo; DiLoCo here only past
// 2^32 elements): their N-sized buffers.
Z extra_floats(OptimizerType t) {
  switch (t) {
    case OptimizerType::topk_ef: return 3;      // residual, g_bar, received values
    case OptimizerType::randk_ef: return 3;     // residual, draw, g_bar
    case OptimizerType::onebit_adam: return 6;  // worker error, local, m_sync, acc, g_bar, server error
    case OptimizerType::powersgd: return 3;     // error, g_bar, vectors
    case OptimizerType::demo: return 4;         // coefficients, removed, values, g_bar
    case OptimizerType::diloco: return 5;       // global, outer momentum, pseudo-gradient, mean, scratch
    case OptimizerType::sparseloco: return 4;   // global, error, delta, mean
    default: return 1;
  }
}

// One of `workers` workers' state of the method `o` over n parameters, whose tensors are
// `tensors` when given (a language model) and one tensor otherwise.
Z method_bytes(const OptimizerConfig& o, Z n, int workers, const std::optional<ParamLayout>& tensors) {
  if (has_device_bytes(o.type) && n <= ParamLayout::kMaxIndexed) {
    // The same buffers as on a GPU (optimizers/device_state.hpp), on the host.
    ParamLayout layout;
    if (tensors) {
      layout = *tensors;
    } else {
      layout.add("theta", {n}, true);  // a trace's tensors as one: the same buffers but per-tensor k
    }
    // SCAPE's all-gathers also pass through the communicator's private copy of the send buffer
    // (core/communicator.cpp, wire_scratch), measured at N floats a worker.
    const Z wire = o.type == OptimizerType::scape ? kFloat * n : 0;
    return optimizer_device_bytes(o, layout, workers) + wire;
  }
  const Z own = o.sharded ? (n + static_cast<Z>(workers) - 1) / static_cast<Z>(workers) : n;
  const bool adamw = o.type == OptimizerType::adamw || (o.type == OptimizerType::scape && o.inner == InnerRule::adamw);
  return kFloat * own * (adamw ? 2 : 1) + kFloat * n * extra_floats(o.type);
}

// optimizer.hierarchy = "node" (optimizers/hierarchical.hpp): the rail method's state over a part
// of ceil(N / G), taken as one tensor, among the W / G nodes, and the node's buffers: the packed
// gradient and the gathered parameters (N floats each), the rail's gradient and parameters and the
// communicator's copy of the part it all-gathers (a part each).
Z hierarchical_bytes(const OptimizerConfig& o, Z n, int workers) {
  const int g = o.ranks_per_node;
  const Z part = (n + static_cast<Z>(g) - 1) / static_cast<Z>(g);
  OptimizerConfig rail = o;
  rail.hierarchy = Hierarchy::flat;
  rail.rail_split = RailSplit::tensors;
  return method_bytes(rail, part, workers / g, std::nullopt) + kFloat * (2 * n + 3 * part);
}

// One worker's optimizer state.
Z optimizer_bytes(const config::ExperimentConfig& c, Z n) {
  const auto& o = c.optimizer;
  if (n == 0) return 0;  // a trace that cannot be read: the run's own load names it
  if (o.hierarchy == Hierarchy::node) return hierarchical_bytes(o, n, c.workers);
  std::optional<ParamLayout> tensors;
  if (c.has_data() && has_device_bytes(o.type) && n <= ParamLayout::kMaxIndexed) {
    tensors = config::language_model_spec(c.model).layout();
  }
  return method_bytes(o, n, c.workers, tensors);
}

}  // namespace

std::size_t HostMemory::total() const {
  Z t = 0;
  for (const auto& [name, bytes] : parts()) t += bytes;
  return t;
}

std::vector<std::pair<std::string, std::size_t>> HostMemory::parts() const {
  return {{"data", data},           {"parameters", parameters},
          {"gradients", gradients}, {"activations", activations},
          {"optimizer", optimizer}, {"logs", logs},
          {"program", program}};
}

std::pair<std::string, std::size_t> HostMemory::largest() const {
  const auto p = parts();
  return *std::max_element(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
}

HostMemory times_processes(const HostMemory& one, int processes) {
  const auto k = static_cast<std::size_t>(std::max(processes, 1));
  HostMemory m = one;
  for (std::size_t* part : {&m.data, &m.parameters, &m.gradients, &m.activations, &m.optimizer, &m.logs, &m.program})
    *part *= k;
  m.workers = one.workers * static_cast<int>(k);
  return m;
}

HostMemory host_memory_estimate(const config::ExperimentConfig& config, int workers_in_process) {
  HostMemory m;
  m.workers = workers_in_process;
  const Z w = static_cast<Z>(std::max(workers_in_process, 1));
  const Z n = parameter_count(config);
  const bool model_on_host = config.device == kernels::DeviceKind::cpu;
  m.data = data_bytes(config);
  if (model_on_host) {
    m.parameters = w * kFloat * n;
    m.gradients = w * kFloat * n;
    if (config.has_data()) {
      const auto spec = config::language_model_spec(config.model);
      const Z B = static_cast<Z>(config.data.batch_size), T = static_cast<Z>(spec.block_size());
      // The workspace, and the batch's input and target ids (int32).
      m.activations = w * (model::workspace_bytes(spec.shape(), B, T) + 2 * sizeof(std::int32_t) * B * T);
    }
  }
  if (config.optimizer.device == kernels::DeviceKind::cpu) m.optimizer = w * optimizer_bytes(config, n);
  // Rank 0: the mean gradient, worker 0's update statistics (a copy of theta and the signs) and
  // the m_prev of the choosing step; with the oracle metrics, each worker's e_i + g_i and m_prev
  // copies and rank 0's mean and statistic over them.
  m.logs = 3 * kFloat * n + n;
  if (config.log.oracle && has_oracle_metrics(config.optimizer)) m.logs += (2 * w + 2) * kFloat * n;
  m.program = kProgram + w * kPerThread;
  return m;
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1024.0 * kMiB) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * kMiB));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / kMiB);
  }
  return buf;
}

std::string describe(const HostMemory& m) {
  std::ostringstream out;
  out << "host memory estimate (" << m.workers << (m.workers == 1 ? " worker" : " workers") << " in this process):\n";
  for (const auto& [name, bytes] : m.parts()) {
    char line[96];
    std::snprintf(line, sizeof line, "  %-12s %12s\n", name.c_str(), format_bytes(static_cast<double>(bytes)).c_str());
    out << line;
  }
  char line[96];
  std::snprintf(line, sizeof line, "  %-12s %12s", "total", format_bytes(static_cast<double>(m.total())).c_str());
  out << line;
  return out.str();
}

std::size_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  Z kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

void require_host_memory(const HostMemory& need, std::size_t available) {
  if (available == 0 || need.total() <= available) return;
  const auto [name, bytes] = need.largest();
  throw config::ConfigError(
      "the run needs about " + format_bytes(static_cast<double>(need.total())) + " of host memory, the largest part " +
      name + " (" + format_bytes(static_cast<double>(bytes)) + "), but this machine has " +
      format_bytes(static_cast<double>(available)) +
      " available (MemAvailable): lower it (scape validate lists the parts), or add --force-memory to run anyway");
}

}  // namespace scape::train
