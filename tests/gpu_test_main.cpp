// The entry point of the GPU tests (test_cuda_kernels, test_device_*): without a visible CUDA
// device the program says so and exits 77, which ctest counts as skipped; otherwise doctest
// runs its cases with the command line's options.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>

#include "kernels/backend.hpp"

int main(int argc, char** argv) {
  if (scape::kernels::cuda_device_count() == 0) {
    const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "GPU test";
    std::printf("no CUDA device visible: %s skipped\n", program.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
