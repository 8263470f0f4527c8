// The device's own time of a span of work queued on a backend: what a GPU spent on the
// forward/backward pass, measured with CUDA events on the backend's stream rather than by the
// host around it (train/train_loop.cpp, the `compute_device_time` column).
#pragma once

#include <memory>

#include "kernels/backend.hpp"

namespace scape::kernels {

class DeviceSpan {
 public:
  virtual ~DeviceSpan() = default;
  // Marks the start on the backend's stream: the work queued after it is timed.
  virtual void start() = 0;
  // Marks the end, waits for it, and returns the seconds the stream spent between the marks.
  virtual double stop_seconds() = 0;
};

// A span on `backend`'s stream: CUDA events for a CUDA backend; nullptr for the CPU backend,
// whose kernels run on the calling thread, so the host's wall time already is their time.
std::unique_ptr<DeviceSpan> make_device_span(KernelBackend& backend);

}  // namespace scape::kernels
