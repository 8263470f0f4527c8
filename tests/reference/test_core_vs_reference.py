"""The C++ core against the independent numpy reference, step by step, on recorded gradient traces.

Each case writes a trace (a layout with dense-named tensors, W workers' gradients for T steps,
the initial parameters) to a folder, runs the core on it through the `core_steps` program
(tests/reference/core_steps.cpp, found through $SCAPE_CORE_STEPS, which ctest sets) and
`run_reference` on the same arrays, and requires, at every step, the masks to be identical and
the parameters, the first moment and every worker's residual to agree within 1e-6 of the
array's largest magnitude. The cases cover the three formulations, replicated and sharded state,
W = 1, 3 and 8, both mask scopes, lag 0 and 1, clipping, the density warm-up and cool-down, and
the fp8 payload (replicated, over a refresh of its scale).
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.reference.scape_reference import run_reference

CORE = os.environ.get("SCAPE_CORE_STEPS")
pytestmark = pytest.mark.skipif(
    not CORE or not Path(CORE).exists(),
    reason="SCAPE_CORE_STEPS does not name the built core_steps program (ctest sets it)")

LAYOUT = [
    {"name": "wte", "size": 320, "decay": False},
    {"name": "h.0.attn_norm.w", "size": 40, "decay": False},
    {"name": "h.0.attn.qkv.w", "size": 480, "decay": True},
    {"name": "h.0.attn.qkv.bias", "size": 120, "decay": False},
    {"name": "h.0.mlp.fc.w", "size": 640, "decay": True},
    {"name": "norm.w", "size": 40, "decay": False},
]
STEPS = 12
TOLERANCE = 1e-6


def trace(workers, steps, seed=5):
    """Gradients [T, W, N] whose scale differs by tensor, and the initial parameters."""
    rng = np.random.default_rng(seed)
    n = sum(t["size"] for t in LAYOUT)
    scale = np.concatenate([np.full(t["size"], 10.0 ** -(i % 3)) for i, t in enumerate(LAYOUT)])
    grads = (rng.standard_normal((steps, workers, n)) * scale + 0.3 * scale).astype(np.float32)
    theta0 = (0.02 * rng.standard_normal(n)).astype(np.float32)
    return theta0, grads


def run_core(tmp_path, optimizer, workers, theta0, grads):
    steps = grads.shape[0]
    spec = {"workers": workers, "steps": steps, "optimizer": optimizer, "layout": LAYOUT}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    theta0.tofile(tmp_path / "theta0.f32")
    grads.tofile(tmp_path / "grads.f32")
    done = subprocess.run([CORE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    n = theta0.size
    read = lambda name, dtype, shape: np.fromfile(tmp_path / name, dtype=dtype).reshape(shape)
    return (read("theta.f32", np.float32, (steps, n)), read("m.f32", np.float32, (steps, n)),
            read("residual.f32", np.float32, (steps, workers, n)), read("mask.u8", np.uint8, (steps, n)))


def close(core, ref):
    """Largest difference relative to the reference's largest magnitude (absolute below 1e-20)."""
    return float(np.max(np.abs(core.astype(np.float64) - ref))) / max(float(np.max(np.abs(ref))), 1e-20)


def cases():
    base = {"type": "scape", "sparsity": 0.9, "lr": 1e-2, "warmup_steps": 2, "weight_decay": 0.1}
    out = []
    for formulation in ("paper", "artifact", "frozen_momentum"):
        for sharded in (False, True):
            for workers in (1, 3, 8):
                opt = dict(base, formulation=formulation, sharded=sharded)
                out.append((f"{formulation}-{'sharded' if sharded else 'replicated'}-W{workers}", opt, workers, STEPS))
    extra = {
        "shard-scope": {"mask_scope": "shard"},
        "no-dense-tensors": {"dense_tensors": []},
        "lag0": {"mask_lag": 0},
        "clip": {"clip_grad": 0.05},
        "warmup": {"density_warmup": 6, "density_start": 0.5},
        "cooldown": {"density_cooldown": 5, "density_cooldown_start": 4},
        "sparse-0.99": {"sparsity": 0.99},
        "momentum-corrected": {"adams_form": "momentum_corrected"},
    }
    for formulation in ("paper", "artifact", "frozen_momentum"):
        for sharded in (False, True):
            for name, keys in extra.items():
                opt = dict(base, formulation=formulation, sharded=sharded, **keys)
                out.append((f"{formulation}-{'sharded' if sharded else 'replicated'}-{name}", opt, 3, STEPS))
        # The fp8 payload (replicated state only), over a refresh of its scale at step 101.
        fp8 = dict(base, formulation=formulation, sharded=False, wire_dtype="fp8_e5m2")
        out.append((f"{formulation}-replicated-fp8", fp8, 3, STEPS))
        out.append((f"{formulation}-replicated-fp8-W8-105-steps", fp8, 8, 105))
    return out


@pytest.mark.parametrize("name,optimizer,workers,steps", cases(), ids=[c[0] for c in cases()])
def test_core_matches_reference(tmp_path, name, optimizer, workers, steps):
    theta0, grads = trace(workers, steps)
    theta, m, residual, mask = run_core(tmp_path, optimizer, workers, theta0, grads)
    steps = run_reference(optimizer, LAYOUT, theta0, grads, steps)
    for t, ref in enumerate(steps):
        where = f"{name}, step {t + 1}"
        assert np.array_equal(mask[t].astype(bool), ref["mask"]), \
            f"{where}: masks differ at {np.flatnonzero(mask[t].astype(bool) != ref['mask'])[:10]}"
        assert close(theta[t], ref["theta"]) <= TOLERANCE, f"{where}: parameters {close(theta[t], ref['theta']):.3g}"
        assert close(m[t], ref["m"]) <= TOLERANCE, f"{where}: first moment {close(m[t], ref['m']):.3g}"
        assert close(residual[t], ref["residual"]) <= TOLERANCE, \
            f"{where}: residuals {close(residual[t], ref['residual']):.3g}"
