#!/usr/bin/env bash
# Stage 2 of scripts/device-check.sh: runs the prebuilt GPU checks on a lent GPU machine.
# `scripts/device-check.sh prepare` copies this file to device-carry/run.sh next to the
# prebuilt executables (device-carry/bin) and the shared libraries they load (device-carry/lib).
# Needs bash, coreutils (timeout), the NVIDIA driver, and libnccl.so.2 (the pip wheel
# nvidia-nccl-cu13, found through python3, or the system's); not cmake, a compiler, Eigen,
# HDF5, MPI or the network. Usage, from the repository root:
#   OUT=DIR bash device-carry/run.sh          (OUT defaults to ./device-out)
# Environment: DEVICE_RUN_BUDGET_S (default 450: the whole run, every per-step timeout is cut
# to what is left of it), NCCL_LIB_DIR (a folder holding libnccl.so.2, tried first).
#
# It records the machine (nvidia-smi, glibc, how each executable's libraries resolve), runs each
# GPU test with its own timeout, then bench_cuda, bench_device_step and bench_model_cuda with JSON output, and
# prints a summary table last. A test is "passed" (exit 0), "skipped" (exit 77: no CUDA
# device; the reason is its own message), "not run" (a library it needs is missing: the NCCL
# tests without libnccl.so.2; never counted as passed), or "FAILED" (any other exit status, a
# timeout, or a carried library that does not resolve). Exit status: 0 when nothing failed.
#
# $OUT receives at most 7 files (the device tool returns 8 at most): summary.txt, env.txt,
# tests.log, bench.log, bench_cuda.json, bench_device_step.json, bench_model_cuda.json.
#
# glibc: the executables were linked on the preparing machine (Debian 12, glibc 2.36) and run
# only where glibc is at least as new; libstdc++, libgcc_s and glibc come from the system.
# Otherwise use `scripts/device-check.sh build` on a machine with the Debian packages.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -d "$here/bin" ]; then
  carry="$here"
else
  carry="${DEVICE_CARRY:-$PWD/device-carry}"
fi
if [ ! -d "$carry/bin" ]; then
  echo "device-run: $carry/bin not found: run 'scripts/device-check.sh prepare' first and carry device-carry" >&2
  exit 2
fi
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
budget_s="${DEVICE_RUN_BUDGET_S:-450}"
start=$(date +%s)
summary="$OUT/summary.txt" env_txt="$OUT/env.txt" tests_log="$OUT/tests.log" bench_log="$OUT/bench.log"
: >"$summary"
: >"$env_txt"
: >"$tests_log"
: >"$bench_log"

step_log="$(mktemp)"
trap 'rm -f "$step_log"' EXIT

elapsed() { echo $(($(date +%s) - start)); }
log() { echo "[device-run +$(elapsed)s] $*"; }
# Records a row of the summary table: NAME STATUS DETAIL.
rows=()
row() { rows+=("$(printf '%-24s %-9s %s' "$1" "$2" "$3")"); }
failed=0

# ---- libraries: the carried ones, then NCCL from the wheel or the system ----
# The folder of library $1 (a path matching $2) under the usual prefixes, or "system" when only
# ld.so.cache has it (nothing to add to the path).
find_lib_dir() {
  local d
  d="$(timeout 30 find /opt /usr/local /usr/lib /root -name "$1" -path "$2" 2>/dev/null | head -1 || true)"
  if [ -n "$d" ]; then
    dirname "$d"
    return 0
  fi
  if ldconfig -p 2>/dev/null | grep -qF "$1 "; then
    echo system
    return 0
  fi
  return 1
}

find_nccl_dir() {
  local d
  if [ -n "${NCCL_LIB_DIR:-}" ] && [ -e "$NCCL_LIB_DIR/libnccl.so.2" ]; then
    echo "$NCCL_LIB_DIR"
    return 0
  fi
  if command -v python3 >/dev/null; then
    # nvidia.nccl is a namespace package in some wheels (no __file__): use its __path__.
    d="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
    if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then
      echo "$d"
      return 0
    fi
    # Every site-packages folder python3 knows.
    while IFS= read -r sp; do
      if [ -n "$sp" ] && [ -e "$sp/nvidia/nccl/lib/libnccl.so.2" ]; then
        echo "$sp/nvidia/nccl/lib"
        return 0
      fi
    done < <(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null)
  fi
  # Virtual environments and unusual prefixes (the lent machine's python3 lives in /opt/torch/.venv).
  find_lib_dir libnccl.so.2 '*nvidia/nccl/lib/*'
}

# cuBLAS (the model's GEMMs) is not carried (about 600 MB): the CUDA toolkit's copy, or a wheel's.
find_cublas_dir() {
  local d
  for d in "${CUBLAS_LIB_DIR:-}" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    if [ -n "$d" ] && [ -e "$d/libcublas.so.13" ]; then
      echo "$d"
      return 0
    fi
  done
  find_lib_dir libcublas.so.13 '*'
}

nccl_dir="$(find_nccl_dir || true)"
cublas_dir="$(find_cublas_dir || true)"
ld_path="$carry/lib"
case "$nccl_dir" in
  "" | system) ;;
  *) ld_path="$ld_path:$nccl_dir" ;;
esac
case "$cublas_dir" in
  "" | system) ;;
  *) ld_path="$ld_path:$cublas_dir" ;;
esac
export LD_LIBRARY_PATH="$ld_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The preparing machine's libstdc++ and libgcc_s, only where the system's are missing or older
# than the executables need (LD_LIBRARY_PATH comes before the system's, so never by default).
cxx_note="C++ runtime: the system's"
if ldd "$carry/bin/test_cuda_kernels" 2>&1 |
  grep -qE "(libstdc\+\+\.so\.6|libgcc_s\.so\.1) => not found|(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found"; then
  export LD_LIBRARY_PATH="$carry/lib/fallback:$LD_LIBRARY_PATH"
  cxx_note="C++ runtime: the carried fallback (the system's is missing or too old)"
fi

glibc_here="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
glibc_built="$(sed -n 's/^glibc=//p' "$carry/BUILD-INFO" 2>/dev/null)"
glibc_note="glibc ${glibc_here:-unknown} (built with ${glibc_built:-unknown})"
if [ -n "$glibc_here" ] && [ -n "$glibc_built" ] &&
  [ "$(printf '%s\n%s\n' "$glibc_built" "$glibc_here" | sort -V | head -1)" != "$glibc_built" ]; then
  glibc_note="$glibc_note: TOO OLD, the executables cannot load here; use 'scripts/device-check.sh build'"
fi

{
  echo "==== date, host"
  date -u
  uname -a
  echo "$glibc_note"
  echo "$cxx_note"
  echo "==== BUILD-INFO"
  cat "$carry/BUILD-INFO" 2>/dev/null || echo "(none)"
  echo "==== NCCL: ${nccl_dir:-libnccl.so.2 NOT FOUND}; cuBLAS: ${cublas_dir:-libcublas.so.13 NOT FOUND}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "==== nvidia-smi"
  timeout 30 nvidia-smi 2>&1 || echo "nvidia-smi failed or missing (status $?)"
  echo "==== nvidia-smi -q (clocks, versions)"
  timeout 30 nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -80 || true
} >>"$env_txt" 2>&1
gpu="$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)"
log "GPU: ${gpu:-none visible to nvidia-smi}; NCCL: ${nccl_dir:-not found}; $glibc_note; $cxx_note"

# missing_libs BIN: the libraries of BIN that do not resolve (space separated; empty when all do).
missing_libs() {
  ldd "$1" 2>&1 | awk '/not found/ {printf "%s ", $1}'
}

{
  echo "==== ldd of each executable (LD_LIBRARY_PATH as above)"
  for b in "$carry"/bin/*; do
    echo "-- $(basename "$b")"
    ldd "$b" 2>&1
  done
} >>"$env_txt"

# step_timeout CAP: CAP seconds, or what is left of the budget when that is less.
step_timeout() {
  local left=$((budget_s - $(elapsed)))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# timed_run NAME LOG CAP_S BIN [ARGS...]: runs BIN under a timeout of at most CAP_S (what is left
# of the budget), appends its output to LOG and sets rc, took (seconds) and t (the timeout).
# Returns 1 without running when the budget is used up (the row says so).
timed_run() {
  local name=$1 logfile=$2 cap=$3
  shift 3
  rc=0
  t="$(step_timeout "$cap")"
  if [ "$t" -lt 10 ]; then
    row "$name" "not run" "time budget (${budget_s}s) used up"
    return 1
  fi
  log "$name: running (timeout ${t}s)"
  local t0
  t0=$(date +%s)
  timeout -k 10 "$t" "$@" >"$step_log" 2>&1 || rc=$?
  took=$(($(date +%s) - t0))
  cat "$step_log" >>"$logfile"
  echo "---- exit status $rc after ${took}s" >>"$logfile"
  return 0
}

# can_run NAME BINARY LOG [needs-nccl]: opens NAME's section of LOG; true when BINARY was carried
# and its libraries resolve. Otherwise NAME's row says why and it returns 1: "not run" when the
# only missing library is libnccl.so.2 and NAME needs NCCL, else FAILED.
can_run() {
  local name=$1 bin="$carry/bin/$2" log=$3 needs=${4:-} missing
  {
    echo
    echo "==================== $name ($2)"
  } >>"$log"
  if [ ! -x "$bin" ]; then
    row "$name" "FAILED" "executable $2 not carried"
    failed=1
    return 1
  fi
  missing="$(missing_libs "$bin")"
  [ -z "$missing" ] && return 0
  echo "missing libraries: $missing" >>"$log"
  if [ "$needs" = needs-nccl ] && [ "$missing" = "libnccl.so.2 " ]; then
    row "$name" "not run" "libnccl.so.2 not found (no nvidia-nccl wheel, NCCL_LIB_DIR or system NCCL)"
  else
    row "$name" "FAILED" "cannot load: ${missing% }"
    failed=1
  fi
  return 1
}

# run_test NAME BINARY CAP_S [needs-nccl]
run_test() {
  local name=$1 bin="$carry/bin/$2" cap=$3 reason
  can_run "$name" "$2" "$tests_log" "${4:-}" || return 0
  timed_run "$name" "$tests_log" "$cap" "$bin" || return 0
  case $rc in
    0) row "$name" "passed" "${took}s" ;;
    77)
      reason="$(grep -m1 -i 'skipped' "$step_log" || echo 'exit 77, no reason printed')"
      row "$name" "skipped" "$reason"
      ;;
    124 | 137)
      row "$name" "FAILED" "timed out after ${t}s"
      failed=1
      ;;
    *)
      row "$name" "FAILED" "exit status $rc after ${took}s (tests.log)"
      failed=1
      ;;
  esac
}

# run_bench NAME CAP_S: NAME's console output to bench.log, its JSON to $OUT/NAME.json.
run_bench() {
  local name=$1 cap=$2 bin="$carry/bin/$1"
  can_run "$name" "$name" "$bench_log" || return 0
  timed_run "$name" "$bench_log" "$cap" "$bin" --benchmark_format=console --benchmark_out="$OUT/$name.json" \
    --benchmark_out_format=json || return 0
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    row "$name" "FAILED" "timed out after ${t}s"
    failed=1
  elif [ "$rc" -ne 0 ]; then
    row "$name" "FAILED" "exit status $rc after ${took}s (bench.log)"
    failed=1
  elif grep -q 'CUDA benchmarks skipped' "$step_log"; then
    row "$name" "skipped" "$(grep -m1 'CUDA benchmarks skipped' "$step_log")"
  elif grep -q 'offload_overhead/cuda not run' "$step_log"; then
    row "$name" "cpu only" "$(grep -m1 'offload_overhead/cuda not run' "$step_log") (${took}s)"
  else
    row "$name" "ran" "${took}s"
  fi
}

# run_training NAME CAP_S [--backend nccl] [--set KEY=VALUE ...]: the carried scape trains the
# carried device config (the one-GPU simulator, device = cuda; with --backend nccl one NCCL rank
# in-process) with the given overrides; its run file stays outside $OUT, the row quotes the last
# progress line (losses, tokens/s). The carried scape links NCCL, so it needs libnccl.so.2 too.
run_training() {
  local name=$1 cap=$2 last
  shift 2
  can_run "$name" scape "$tests_log" needs-nccl || return 0
  timed_run "$name" "$tests_log" "$cap" "$carry/bin/scape" run "$carry/configs/device-check-run.json" \
    --out "$(dirname "$step_log")/$name.h5" --force "$@" || return 0
  last="$(grep -E '^step ' "$step_log" | tail -1 | tr -s ' ')"
  if [ "$rc" -eq 0 ]; then
    row "$name" "ran" "${last:-no progress line} (${took}s)"
  elif [ "$rc" -eq 2 ] && grep -q 'no CUDA device is visible' "$step_log"; then
    row "$name" "skipped" "no CUDA device visible (scape exits 2 before training)"
  else
    row "$name" "FAILED" "exit status $rc after ${took}s (tests.log)"
    failed=1
  fi
}

# ---- the GPU tests, the one-GPU simulator runs, then the benchmarks ----
run_test test_cuda_kernels test_cuda_kernels 90
run_test test_cuda_passes test_cuda_passes 60
run_test test_cuda_model_ops test_cuda_model_ops 60
run_test test_device_optimizer test_device_optimizer 120
run_test test_device_model test_device_model 60
run_test test_device_train test_device_train 120
run_training sim_scape_paper_0.99 90 --set optimizer.type=scape --set optimizer.formulation=paper \
  --set optimizer.sparsity=0.99 --set optimizer.lr=0.01
run_training sim_scape_artifact_0.9_fp8 90 --set optimizer.type=scape --set optimizer.formulation=artifact \
  --set optimizer.sharded=false --set optimizer.wire_dtype=fp8_e5m2 --set optimizer.sparsity=0.9 --set optimizer.lr=0.01 \
  --set optimizer.clip_grad=1.0
run_training sim_adams 90 --set optimizer.type=adams --set optimizer.lr=0.001
run_test nccl_collectives_w1 nccl_collectives_check 90 needs-nccl
run_test nccl_scape_w1 nccl_scape_check 90 needs-nccl
run_test nccl_single_w1 nccl_single_check 90 needs-nccl
run_training nccl_run_w1_scape_0.99 60 --backend nccl --set workers=1 --set steps=100 --set optimizer.type=scape \
  --set optimizer.sparsity=0.99 --set optimizer.lr=0.01
run_bench bench_cuda 150
run_bench bench_device_step 120
run_bench bench_model_cuda 120

# ---- summary ----
{
  echo "==== device-check summary ($(elapsed)s; GPU: ${gpu:-none}; NCCL: ${nccl_dir:-not found})"
  echo "$glibc_note; $cxx_note"
  printf '%-24s %-9s %s\n' "step" "status" "detail"
  printf '%s\n' "${rows[@]}"
  if command -v python3 >/dev/null; then
    python3 - "$OUT/bench_cuda.json" "$OUT/bench_device_step.json" "$OUT/bench_model_cuda.json" <<'PY'
import json, os, sys
keys = ("frac_of_d2d", "speedup_vs_cub_sort", "frac_of_pinned_copy", "offload_overhead", "device_MiB_saved",
        "resident_step_ms", "offloaded_step_ms", "tokens/s", "model_TFLOP/s", "frac_of_layer_gemm",
        "frac_of_peak_gemm")
for path in sys.argv[1:]:
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        continue
    try:
        data = json.load(open(path))
    except ValueError as e:
        print(f"{os.path.basename(path)}: unreadable ({e})")
        continue
    ctx = data.get("context", {})
    refs = {k: ctx[k] for k in ctx if "GB/s" in k or "_ms" in k}
    print(f"{os.path.basename(path)}: " + (", ".join(f"{k} {float(v):.4g}" for k, v in refs.items()) or "no references"))
    for b in data.get("benchmarks", []):
        name = b.get("run_name", b["name"]).split("/min_time")[0].replace("/manual_time", "")
        extras = "  ".join(f"{k} {b[k]:.3f}" for k in keys if k in b)
        print(f"  {name:<36} {b.get('real_time', 0):9.3f} {b.get('time_unit', '')}  {extras}")
PY
  else
    echo "(python3 missing: benchmark headlines not extracted; see bench.log)"
  fi
  if [ "$failed" -eq 0 ]; then echo "result: nothing failed"; else echo "result: FAILURES (tests.log, bench.log)"; fi
} >"$summary" 2>&1
cat "$summary"
exit "$failed"
