// Resident and offloaded residual (docs/algorithms.md, "Devices and residual offload").
#include "optimizers/feedback/residual_store.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>

namespace scape {

ResidualStore::ResidualStore(kernels::KernelBackend& backend, std::size_t n, bool offload, std::size_t chunk_elements)
    : backend_(backend), n_(n), resident_(backend) {
  if (!offload) {
    resident_.assign_zero(n);
    return;
  }
  host_ = static_cast<float*>(backend.allocate_pinned_host(std::max<std::size_t>(n, 1) * sizeof(float)));
  std::memset(host_, 0, n * sizeof(float));
  copier_ = backend.make_chunk_copier(std::min(chunk_elements, std::max<std::size_t>(n, 1)));
}

ResidualStore::~ResidualStore() {
  // A failed device leaves a sticky error that finish() rethrows; a destructor must not throw,
  // and the error has already been reported by the call that met it.
  try {
    if (copier_) copier_->finish();
  } catch (const std::exception&) {
  }
  copier_.reset();
  if (host_ != nullptr) backend_.deallocate_pinned_host(host_);
}

void ResidualStore::for_each_chunk(bool write_back, const ChunkFn& fn) {
  if (!copier_) {
    fn(0, resident_.span());
    return;
  }
  const std::size_t chunk = copier_->chunk_elements();
  const std::size_t chunks = (n_ + chunk - 1) / chunk;
  auto length = [&](std::size_t c) { return std::min(chunk, n_ - c * chunk); };
  if (chunks == 0) return;
  copier_->upload(0, host_, length(0));
  for (std::size_t c = 0; c < chunks; ++c) {
    const int s = static_cast<int>(c % 2);
    // The next chunk's upload waits only for its slot to be freed by chunk c - 1.
    if (c + 1 < chunks) copier_->upload(1 - s, host_ + (c + 1) * chunk, length(c + 1));
    copier_->wait_upload(s);
    fn(c * chunk, copier_->slot(s).first(length(c)));
    if (write_back) {
      copier_->download(s, host_ + c * chunk, length(c));
    } else {
      copier_->release(s);
    }
  }
  copier_->finish();
}

std::span<float> ResidualStore::resident() {
  if (copier_) throw std::logic_error("ResidualStore::resident: the residual is offloaded to host memory");
  return resident_.span();
}

std::span<float> ResidualStore::host_view() { return copier_ ? std::span<float>(host_, n_) : resident_.span(); }

std::span<const float> ResidualStore::host_view() const {
  return copier_ ? std::span<const float>(host_, n_) : resident_.span();
}

std::size_t ResidualStore::device_bytes() const { return copier_ ? copier_->device_bytes() : n_ * sizeof(float); }

}  // namespace scape
