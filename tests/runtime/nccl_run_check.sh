#!/bin/sh
# End to end: `mpirun -np 1 scape run --backend nccl` on a small noisy quadratic must complete
# (exit 0) and write its run file. Without a CUDA device it must fail cleanly instead: exit
# status 2 and a message naming the cause; the test then reports itself skipped (77).
# Usage: nccl_run_check.sh MPIEXEC SCAPE
set -u
mpiexec=$1
scape=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/config.json" <<'JSON'
{"name": "nccl-smoke", "seed": 3, "workers": 1, "steps": 20,
 "model": {"type": "quadratic", "size": 4096},
 "optimizer": {"type": "scape", "sparsity": 0.99, "lr": 0.01},
 "log": {"save_params": true}}
JSON
"$mpiexec" --oversubscribe -np 1 "$scape" run "$dir/config.json" --backend nccl --quiet --out "$dir/run.h5" \
  >"$dir/log" 2>&1
status=$?
cat "$dir/log"
if grep -q "no CUDA device visible" "$dir/log"; then
  if [ "$status" -ne 2 ]; then
    echo "FAIL: without a CUDA device scape run --backend nccl should exit with status 2, got $status"
    exit 1
  fi
  echo "no CUDA device visible: NCCL tests skipped (scape run --backend nccl failed cleanly with status 2)"
  exit 77
fi
if [ "$status" -ne 0 ]; then
  echo "FAIL: scape run --backend nccl exited with status $status"
  exit 1
fi
if [ ! -s "$dir/run.h5" ]; then
  echo "FAIL: no run file written"
  exit 1
fi
echo "PASS: scape run --backend nccl completed and wrote its run file"
