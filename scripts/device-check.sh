#!/usr/bin/env bash
# The GPU checks of scape: the CUDA kernel and device-optimizer tests, the NCCL tests at W = 1,
# and the CUDA benchmarks (docs/runtime.md, "Running the GPU checks on a lent device").
#
#   scripts/device-check.sh prepare   Here, on a machine with the Debian packages of
#                                     scripts/setup-deps and nvcc (no GPU needed): builds the
#                                     GPU test executables and the three benchmarks (Release,
#                                     sm_90, no MPI) in build/device-prepare and assembles the
#                                     ignored folder device-carry/: bin/ (the executables),
#                                     lib/ (the shared libraries they load that a bare CUDA
#                                     machine may lack), BUILD-INFO and run.sh.
#   scripts/device-check.sh run       On the GPU machine, from the repository root, with
#                                     device-carry/ carried there: runs device-carry/run.sh
#                                     (scripts/device-run.sh), which needs no cmake, compiler,
#                                     Eigen, HDF5, MPI or network; libnccl.so.2 comes from the
#                                     pip wheel nvidia-nccl-cu13 or the system. Results go to
#                                     $OUT (default ./device-out), a summary table to stdout.
#   scripts/device-check.sh torch     On a GPU machine with python3, torch, h5py and pytest (the
#                                     lent one has them; nothing to carry but the working tree):
#                                     the torch-native optimizer's suite on CUDA
#                                     (python/tests/test_torch_scape_device.py: the CUDA step
#                                     against the CPU step on one trace, Hierarchical on 2 x 2
#                                     ranks sharing the GPU against its CPU run, the loop checks;
#                                     and test_torch_scape.py), its step time against
#                                     AdamW(fused=True) at 100M and 500M parameters
#                                     (python/bench/bench_torch_gpu.py) and on GPT-2 and Llama
#                                     layouts at full and 1/4 width with its kernels a step
#                                     (bench_torch_scape.py --layouts), and a 2 × 600-step
#                                     convergence run of examples/torch_nanogpt.py (width 384,
#                                     6 blocks) under SCAPE 90% and AdamS. Results in $OUT.
#   scripts/device-check.sh build     On a GPU machine that has the Debian packages (or can
#                                     install them): configures and builds everything in
#                                     build/device, runs the GPU tests, the benchmarks, then the
#                                     rest of the suite while time remains.
#
# With the device tool of this workplace, after `prepare` here:
#   run(command="OUT=\"$OUT\" bash device-carry/run.sh", carry=["device-carry"], timeout_s=540)
# and for the torch-native optimizer, with nothing prepared:
#   run(command="OUT=\"$OUT\" scripts/device-check.sh torch", timeout_s=540)
#
# Compatibility: `prepare` links on Debian 12 (glibc 2.36); the executables load only where
# glibc is 2.36 or newer (the lent machine's Ubuntu image is newer; run.sh reports a mismatch).
# libc, libm, libstdc++ and libgcc_s come from the running system, libcuda from its driver and
# libnccl from its NCCL wheel; everything else they load is carried. Where that fails, use
# `build` on the GPU machine itself.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
}

# ---------------------------------------------------------------------------------------------
# prepare: build the GPU executables here and assemble device-carry/.
prepare() {
  local build=build/device-prepare carry=device-carry
  local jobs="${JOBS:-2}"
  local targets=(test_cuda_kernels test_cuda_passes test_cuda_model_ops test_device_optimizer test_device_model test_device_train nccl_collectives_check
    nccl_scape_check nccl_single_check bench_cuda bench_device_step bench_model_cuda scape)
  local paths=(tests/test_cuda_kernels tests/test_cuda_passes tests/test_cuda_model_ops tests/test_device_optimizer tests/test_device_model tests/test_device_train
    tests/runtime/nccl_collectives_check tests/runtime/nccl_scape_check tests/runtime/nccl_single_check
    bench/bench_cuda bench/bench_device_step
    bench/bench_model_cuda apps/scape)

  # No MPI (the carried checks are single-process) and no build RPATH (the carried executables
  # find their libraries through run.sh's LD_LIBRARY_PATH only, never a path of this machine).
  echo "== configure $build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCAPE_CUDA=ON -DSCAPE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_SKIP_BUILD_RPATH=ON -DSCAPE_BUILD_TESTS=ON -DSCAPE_BUILD_BENCH=ON \
    >"$build.configure.log" 2>&1 || {
    cat "$build.configure.log"
    echo "prepare: configure failed" >&2
    exit 1
  }
  grep -E '^-- scape:' "$build.configure.log" || true
  if ! grep -q 'NCCL communicator ON' "$build.configure.log"; then
    echo "prepare: the NCCL communicator is not built (nccl.h or libnccl not found): the NCCL tests need it" >&2
    exit 1
  fi
  echo "== build ${targets[*]} (-j $jobs)"
  if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$build.build.log" 2>&1; then
    grep -E -B2 -A10 'error|FAILED' "$build.build.log" | head -60 >&2
    echo "prepare: build failed ($build.build.log)" >&2
    exit 1
  fi
  if grep -qi 'warning' "$build.build.log"; then
    grep -i -A5 'warning' "$build.build.log" | head -40 >&2
    echo "prepare: the build printed warnings ($build.build.log)" >&2
    exit 1
  fi

  echo "== assemble $carry/"
  rm -rf "$carry"
  mkdir -p "$carry/bin" "$carry/lib/fallback"
  local p
  for p in "${paths[@]}"; do
    cp "$build/$p" "$carry/bin/"
  done

  # Shared libraries: every one the executables load, except those every Linux system with a
  # GPU driver and a C++ runtime has (glibc, libstdc++, libgcc_s), the driver's (libcuda) and
  # NCCL (about 200 MB; the lent machine has it in a pip wheel) and cuBLAS (about 600 MB with
  # cuBLASLt, far over the carry limit; run.sh finds the lent machine's CUDA toolkit copy).
  local system_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcublas)'
  local bin line soname path missing=0
  for bin in "$carry"/bin/*; do
    while IFS= read -r line; do
      soname=$(awk '{print $1}' <<<"$line")
      path=$(awk '$2 == "=>" {print $3}' <<<"$line")
      [[ "$soname" =~ $system_re ]] && continue
      if [ "$path" = "not" ] || [ -z "$path" ]; then
        [[ "$line" == *"=>"* ]] || continue  # the dynamic loader itself, without "=>"
        echo "prepare: $(basename "$bin"): $soname does not resolve here" >&2
        missing=1
        continue
      fi
      [ -e "$carry/lib/$soname" ] || cp -L "$path" "$carry/lib/$soname"
    done < <(ldd "$bin")
  done
  [ "$missing" -eq 0 ] || exit 1
  # The CUDA runtime, whether or not an executable links it dynamically (to be safe).
  if [ ! -e "$carry/lib/libcudart.so.13" ]; then
    path=$(ldconfig -p | awk '/libcudart\.so\.13 / && !found {print $NF; found = 1}')
    if [ -z "$path" ]; then
      echo "prepare: libcudart.so.13 not found" >&2
      exit 1
    fi
    cp -L "$path" "$carry/lib/libcudart.so.13"
  fi
  # The C++ runtime of this machine, used by run.sh only where the system's is missing or older.
  for soname in libstdc++.so.6 libgcc_s.so.1; do
    path=$(ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ && !found {print $NF; found = 1}')
    if [ -n "$path" ]; then cp -L "$path" "$carry/lib/fallback/$soname"; fi
  done

  # No executable may carry an RPATH or RUNPATH of this machine (DT_RPATH would even override
  # LD_LIBRARY_PATH); carried libraries are only reported.
  for bin in "$carry"/bin/* "$carry"/lib/*.so*; do
    if readelf -d "$bin" | grep -qE '\((RPATH|RUNPATH)\)'; then
      echo "prepare: $(basename "$bin") has $(readelf -d "$bin" | grep -E 'R(UN)?PATH' | tr -s ' ')" >&2
      if [ "${bin#"$carry"/bin/}" != "$bin" ]; then exit 1; fi
    fi
  done

  mkdir -p "$carry/configs"
  cp experiments/configs/device-check-run.json "$carry/configs/"
  cp scripts/device-run.sh "$carry/run.sh"
  chmod +x "$carry/run.sh"
  {
    echo "glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
    echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"')"
    echo "commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (working tree modified)')"
    echo "cxx=$(c++ --version | head -1)"
    echo "nvcc=$(grep -m1 -o 'release [0-9.]*, V[0-9.]*' < <(/usr/local/cuda/bin/nvcc --version 2>/dev/null || nvcc --version))"
    echo "cuda_architectures=90"
    echo "nccl_header=$(grep -E '#define NCCL_(MAJOR|MINOR|PATCH) ' "$(sed -n 's/^SCAPE_NCCL_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")/nccl.h" 2>/dev/null | awk '{printf "%s%s", sep, $3; sep="."}')"
    echo "executables=$(cd "$carry/bin" && echo *)"
    echo "libraries=$(cd "$carry/lib" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ')"
  } >"$carry/BUILD-INFO"

  echo "== $carry/"
  (cd "$carry" && find . -type f -printf '%10s  %p\n' | sort -k2)
  local kib
  kib=$(du -sk "$carry" | cut -f1)
  echo "== $carry/: $((kib / 1024)) MiB ($kib KiB; the device tool carries at most 64 MiB with the working tree)"
  if [ "$kib" -gt $((56 * 1024)) ]; then
    echo "prepare: $carry/ is over 56 MiB, too close to the 64 MiB limit" >&2
    exit 1
  fi
  echo "Next, on the GPU machine from the repository root: OUT=DIR bash $carry/run.sh"
  echo "  device tool: run(command='OUT=\"\$OUT\" bash $carry/run.sh', carry=[\"$carry\"], timeout_s=540)"
}

# ---------------------------------------------------------------------------------------------
# run: on the GPU machine, the prepared executables.
run() {
  if [ ! -x device-carry/run.sh ]; then
    echo "device-check run: device-carry/run.sh not found: run 'scripts/device-check.sh prepare' first" >&2
    exit 2
  fi
  exec bash device-carry/run.sh "$@"
}

# ---------------------------------------------------------------------------------------------
# torch: the torch-native optimizer on the GPU machine's own python3 (docs/python.md, "GPU").
torch_checks() {
  OUT="${OUT:-$PWD/device-out}"
  mkdir -p "$OUT"
  export PYTHONPATH="$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
  local failed=0
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())' |
    tee "$OUT/torch-version.txt"
  echo "== pytest (CUDA)"
  # The example's report test needs the scape binary, which this check does not build.
  timeout 260 python3 -m pytest -q -p no:cacheprovider -k "not go_through_the_report" \
    python/tests/test_torch_scape_device.py python/tests/test_torch_scape.py 2>&1 | tee "$OUT/torch-pytest.log" ||
    failed=1
  echo "== step time"
  timeout 90 python3 python/bench/bench_torch_gpu.py 2>&1 | tee "$OUT/torch-bench.log" || failed=1
  echo "== step time on model layouts (GPT-2 small, Llama 16 layers, full and 1/4 width) against fused AdamW"
  timeout 100 python3 python/bench/bench_torch_scape.py --device cuda --repeats 5 \
    --layouts gpt2-1/4 llama16-1/4 gpt2-small llama16-full 2>&1 | tee "$OUT/torch-bench-layouts.log" || failed=1
  echo "== convergence: examples/torch_nanogpt.py, width 384, 6 blocks, 600 steps (at most 100 s) each"
  for opt in scape adams; do
    timeout 100 python3 examples/torch_nanogpt.py --device cuda --optimizer "$opt" --width 384 --layers 6 \
      --block 128 --batch 32 --steps 600 --lr 1e-3 --eval-interval 100 --out "$OUT/nanogpt" 2>&1 |
      tee "$OUT/torch-nanogpt-$opt.log" || failed=1
  done
  return $failed
}

# ---------------------------------------------------------------------------------------------
# build: configure and build everything on the GPU machine, then test and benchmark. Needs the
# Debian packages of scripts/setup-deps (installed when cmake or ninja is missing, which needs
# apt and a network). Everything goes to $OUT (default ./device-out):
#   nvidia-smi.txt configure.log build.log ctest.log bench_cuda.json bench_cuda.txt
#   bench_device_step.json bench_device_step.txt bench_model_cuda.json bench_model_cuda.txt summary.txt
# A failing step is recorded and the later steps still run; the exit status is 0 only when
# configure, build, the GPU tests and the benchmark all succeeded. Budget: about 8 minutes on
# 16 cores (DEVICE_CHECK_BUDGET_S overrides the deadline for the final, optional full suite).
build() {
  OUT="${OUT:-$PWD/device-out}"
  mkdir -p "$OUT"
  local BUILD=build/device
  local JOBS BUDGET_S start left
  JOBS="$(nproc)"
  BUDGET_S="${DEVICE_CHECK_BUDGET_S:-450}"
  start=$(date +%s)
  : >"$OUT/summary.txt"

  log() { echo "[device-check +$(($(date +%s) - start))s] $*" | tee -a "$OUT/summary.txt"; }

  # step NAME LOGFILE CMD...: runs CMD with output to LOGFILE, records its exit status in
  # status_NAME and never stops the script.
  step() {
    local name=$1 logfile=$2
    shift 2
    log "$name: $*"
    local rc=0
    "$@" >"$logfile" 2>&1 || rc=$?
    printf -v "status_$name" '%s' "$rc"
    log "$name: exit $rc ($(basename "$logfile"))"
    return 0
  }

  status_deps=0 status_configure=skipped status_build=skipped status_ctest_gpu=skipped status_bench=skipped
  status_ctest_rest=skipped status_bench_offload=skipped status_bench_model=skipped

  # Dependencies: only when the build tools are missing (setup-deps needs apt and a network).
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    step deps "$OUT/setup-deps.log" scripts/setup-deps
  fi

  { nvidia-smi || echo "nvidia-smi failed with $?"; } >"$OUT/nvidia-smi.txt" 2>&1
  log "nvidia-smi: $(grep -m1 -o 'NVIDIA H[0-9A-Za-z ]*' "$OUT/nvidia-smi.txt" || echo 'no GPU name found')"

  step configure "$OUT/configure.log" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCAPE_CUDA=ON
  if [ "$status_configure" = 0 ]; then
    # -k 0: build every target that can be built, so one broken target does not hide the others.
    step build "$OUT/build.log" cmake --build "$BUILD" -j "$JOBS" -- -k 0
    grep -i 'warning' "$OUT/build.log" | head -20 >"$OUT/build-warnings.txt" || true
    [ -s "$OUT/build-warnings.txt" ] && log "build: $(wc -l <"$OUT/build-warnings.txt") warning lines (build-warnings.txt)"

    # The GPU tests first: CUDA kernels vs the CPU, the device optimizer, NCCL.
    step ctest_gpu "$OUT/ctest.log" ctest --test-dir "$BUILD" -R 'cuda|device|nccl' --output-on-failure --timeout 300
    log "ctest (GPU): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1 || echo 'no summary')"

    if [ -x "$BUILD/bench/bench_cuda" ]; then
      step bench "$OUT/bench_cuda.txt" "$BUILD/bench/bench_cuda" --benchmark_format=console \
        --benchmark_out="$OUT/bench_cuda.json" --benchmark_out_format=json
    else
      log "bench: $BUILD/bench/bench_cuda was not built"
      status_bench=missing
    fi

    # SCAPE step with the residual offloaded against resident, on the CPU and the GPU.
    if [ -x "$BUILD/bench/bench_device_step" ]; then
      step bench_offload "$OUT/bench_device_step.txt" "$BUILD/bench/bench_device_step" --benchmark_format=console \
        --benchmark_out="$OUT/bench_device_step.json" --benchmark_out_format=json
    else
      log "bench_offload: $BUILD/bench/bench_device_step was not built"
    fi

    # GPT and Llama forward+backward on the GPU against cuBLAS SGEMMs, fp32 and TF32.
    if [ -x "$BUILD/bench/bench_model_cuda" ]; then
      step bench_model "$OUT/bench_model_cuda.txt" "$BUILD/bench/bench_model_cuda" --benchmark_format=console \
        --benchmark_out="$OUT/bench_model_cuda.json" --benchmark_out_format=json
    else
      log "bench_model: $BUILD/bench/bench_model_cuda was not built"
    fi

    # The rest of the suite, within what is left of the budget.
    left=$((BUDGET_S - ($(date +%s) - start)))
    if [ "$left" -gt 60 ]; then
      step ctest_rest "$OUT/ctest-rest.log" timeout "$left" ctest --test-dir "$BUILD" -E 'cuda|device|nccl' \
        -j "$JOBS" --output-on-failure --timeout 300
      {
        echo
        echo "==== rest of the suite (ctest -E 'cuda|device|nccl') ===="
        cat "$OUT/ctest-rest.log"
      } >>"$OUT/ctest.log"
      log "ctest (rest): $(grep -E 'tests passed|tests failed' "$OUT/ctest-rest.log" | tail -1 || echo 'no summary (timed out?)')"
    else
      log "ctest (rest): skipped, ${left}s of the budget left"
    fi
  fi

  # Summary of the benchmarks: each one's time and its ratio to the reference.
  if command -v python3 >/dev/null; then
    local json_file
    for json_file in "$OUT/bench_cuda.json" "$OUT/bench_device_step.json" "$OUT/bench_model_cuda.json"; do
      [ -s "$json_file" ] || continue
      python3 - "$json_file" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
data = json.load(open(sys.argv[1]))
ctx = data.get("context", {})
print(sys.argv[1].rsplit("/", 1)[-1], "references:", {k: ctx[k] for k in ctx if "GB/s" in k or "_ms" in k})
keys = ("GB/s", "frac_of_d2d", "speedup_vs_cub_sort", "cub_sort_ms", "frac_of_pinned_copy", "offload_overhead",
        "resident_step_ms", "offloaded_step_ms", "device_MiB_saved", "tokens/s", "model_TFLOP/s",
        "frac_of_layer_gemm", "frac_of_peak_gemm")
for b in data.get("benchmarks", []):
    extras = {k: round(v, 3) for k, v in b.items() if k in keys}
    print(f"  {b['name']:<40} {b['real_time']:9.3f} {b.get('time_unit', '')}  {extras}")
PY
    done
  fi

  log "status: deps=$status_deps configure=$status_configure build=$status_build ctest_gpu=$status_ctest_gpu" \
    "bench=$status_bench bench_offload=$status_bench_offload bench_model=$status_bench_model" \
    "ctest_rest=$status_ctest_rest"
  local s
  for s in "$status_configure" "$status_build" "$status_ctest_gpu" "$status_bench"; do
    [ "$s" = 0 ] || exit 1
  done
  exit 0
}

mode="${1:-}"
[ $# -gt 0 ] && shift
case "$mode" in
  prepare) prepare "$@" ;;
  run) run "$@" ;;
  build) build "$@" ;;
  torch) torch_checks "$@" ;;
  -h | --help | help) usage ;;
  *)
    echo "device-check: say which stage: prepare, run, build or torch" >&2
    usage
    ;;
esac
