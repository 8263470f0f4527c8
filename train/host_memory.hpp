// The host memory a simulated run takes, from the config alone (nothing is allocated or read
// beyond a data file's size): the data as the source loads it, and per worker of the process its
// parameters, gradients, model activations and optimizer state, plus rank 0's logs and the
// program itself. `scape validate` prints it; `scape run` and every `scape sweep` point refuse a
// config whose total exceeds the machine's available memory (exit 2, --force-memory overrides).
// docs/configuration.md, "Host memory", states the parts; tests/test_host_memory.cpp holds the
// total to the measured peak RSS of five runs of different shapes.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"

namespace scape::train {

struct HostMemory {
  // Bytes of the whole process.
  std::size_t data = 0;         // token corpus (as loaded and split), the quadratic's tables
  std::size_t parameters = 0;   // every worker's copy of the parameters
  std::size_t gradients = 0;    // every worker's gradient
  std::size_t activations = 0;  // every worker's forward/backward workspace and token batch
  std::size_t optimizer = 0;    // every worker's optimizer state and buffers
  std::size_t logs = 0;         // rank 0's metric buffers and the oracle copies the workers send it
  std::size_t program = 0;      // the binary, its libraries and the workers' threads
  int workers = 1;              // workers in this process

  std::size_t total() const;
  // (name, bytes) in the order above.
  std::vector<std::pair<std::string, std::size_t>> parts() const;
  // The largest of the parts.
  std::pair<std::string, std::size_t> largest() const;
};

// For `workers_in_process` workers in one process (the simulator: config.workers; a rank of an
// MPI run: 1). A language model's parameter count comes from its shape without the 2^32
// element limit of a layout, so a model too large to build still gets its estimate.
HostMemory host_memory_estimate(const config::ExperimentConfig& config, int workers_in_process);

// `processes` copies of one process's estimate: the ranks of an MPI or NCCL run that share this
// host, each holding one worker, its own copy of the data and the program.
HostMemory times_processes(const HostMemory& one, int processes);

// "412 MiB", "3.21 GiB": bytes in the machine's words.
std::string format_bytes(double bytes);

// One line a part, then the total: what `scape validate` prints.
std::string describe(const HostMemory& m);

// MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read.
std::size_t available_host_memory();

// Throws config::ConfigError when the estimate exceeds `available` bytes (0: unknown,
// nothing checked), naming the largest part, the estimate and the machine's memory.
void require_host_memory(const HostMemory& need, std::size_t available);

}  // namespace scape::train
