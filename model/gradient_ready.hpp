// The hook through which a model's backward pass reports gradient ranges as they become final,
// so that a dense optimizer can reduce them while the rest of the pass runs
// (optimizer.overlap_grad_reduce).
#pragma once

#include <cstddef>
#include <functional>

namespace scape::model {

// Called with a range [begin, end) of the flat gradient once the backward pass has queued its
// last write to it (on the model's backend: on a GPU the kernels may still be running). The
// ranges of one pass tile [0, N) and come in backward order: the final norm (and a Llama's
// head), the blocks from last to first, then the embeddings.
using GradientReady = std::function<void(std::size_t begin, std::size_t end)>;

}  // namespace scape::model
