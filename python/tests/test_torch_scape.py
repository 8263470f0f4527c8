"""scape.torch.SCAPE and AdamS in training loops: on two torchrun ranks (overlap_backward equal
to the plain step bit for bit, a resume from state_dict bit-identical, DDP with the package's
hook equal to no DDP, GradScaler skipping an inf seen by one rank on every rank, a raising rank
stopping them all), and in one process (bad input named, frozen and gradient-less tensors left
alone, state bytes per parameter equal to the closed form, the extension not needed)."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import scape.torch as st  # noqa: E402
from conftest import REPO, process_output  # noqa: E402

HERE = Path(__file__).resolve().parent


def torchrun(workers, *args, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node",
           str(workers), str(HERE / "torch_loop_worker.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def loop_checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("loop")
    result = torchrun(2, "--mode", "checks", "--out", out)
    assert result.returncode == 0, process_output(result)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("sharded", [0, 1])
def test_overlap_backward_equals_the_plain_step_bit_for_bit(loop_checks, sharded):
    for found in loop_checks:
        assert found[f"buckets_sharded{sharded}"] >= 3
        # every bucket's collective started during backward, not at step()
        assert found[f"buckets_in_backward_sharded{sharded}"] == found[f"buckets_sharded{sharded}"]
        assert found[f"overlap_equals_plain_sharded{sharded}"]


@pytest.mark.parametrize("sharded", [0, 1])
def test_resume_from_state_dict_is_bit_identical(loop_checks, sharded):
    for found in loop_checks:
        assert found[f"resume_bit_identical_sharded{sharded}"]
        assert found[f"scheduler_moved_lr_sharded{sharded}"]  # LambdaLR drove the groups' lr


def test_ddp_with_the_local_gradients_hook_equals_no_ddp(loop_checks):
    assert all(found["ddp_hook_equals_plain"] for found in loop_checks)


def test_grad_scaler_skips_an_inf_seen_by_one_rank_on_every_rank(loop_checks):
    for found in loop_checks:
        assert found["scaler_skipped"] == 1 and found["scaler_steps_done"] == 7
        assert found["scaler_replicas_equal"]


@pytest.mark.parametrize("sharded", [0, 1])
def test_bytes_sent_equal_the_closed_form(loop_checks, sharded):
    for found in loop_checks:
        got, want, total_matches = found[f"bytes_match_closed_form_sharded{sharded}"]
        assert got == want and total_matches


def test_metrics_count_bytes_and_density(loop_checks):
    for found in loop_checks:
        assert found["bytes_sent_last_step"] > 0
        assert 0.1 < found["mask_density_last_step"] < 0.2  # 10% of the matrices, norms and biases whole


def test_a_subgroup_takes_its_own_ranks(tmp_path):
    """Three ranks, SCAPE on the group of ranks 1 and 2 (started from different parameters): the
    group's rank 0 is global rank 1, whose parameters both start from."""
    result = torchrun(3, "--mode", "subgroup", "--out", tmp_path)
    assert result.returncode == 0, process_output(result)
    found = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert found[0] == {}
    assert [f["group_rank"] for f in found[1:]] == [0, 1] and all(f["group_size"] == 2 for f in found[1:])
    assert all(f["replicas_equal"] and f["bytes_sent"] > 0 for f in found[1:])


def test_a_raising_rank_makes_every_rank_exit_non_zero():
    start = time.monotonic()
    result = torchrun(2, "--mode", "raise", timeout=180)
    assert result.returncode != 0
    assert "rank 1 fails at step 3 on purpose" in result.stdout + result.stderr
    assert time.monotonic() - start < 120


# ----- one process ----------------------------------------------------------------------------

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


@pytest.mark.parametrize("kwargs, message", [
    ({"sparsity": 1.0}, r"sparsity must lie in \[0, 1\)"),
    ({"sparsity": -0.1}, r"sparsity must lie in \[0, 1\)"),
    ({"sparsity": "0.9"}, r"sparsity must be a number"),
    ({"formulation": "artifact"}, r"^formulation: expected one of 'paper', got 'artifact'"),
    ({"mask_lag": 2}, r"^mask_lag: expected one of 0, 1, got 2"),
    ({"betas": (0.9, 1.0)}, r"^betas\[1\]: must lie in \[0, 1\)"),
    ({"residual_decay": 1.5}, r"^residual_decay: must lie in \[0, 1\]"),
    ({"clip_grad": -1.0}, r"^clip_grad: must be >= 0"),
    ({"density_warmup": 10, "density_cooldown": 10}, r"^density_warmup, density_cooldown:"),
    ({"overlap_backward": True, "mask_lag": 0}, r"^overlap_backward: needs mask_lag = 1"),
    ({"lr": -1.0}, r"lr must be a number >= 0"),
    ({"wire_dtype": "bf16"}, r"^wire_dtype: expected one of 'fp32', 'fp8_e5m2', got 'bf16'"),
    ({"wire_dtype": "fp8_e5m2", "sharded": True}, r"^wire_dtype: fp8_e5m2 needs sharded=False"),
    ({"total_steps": 0}, r"^total_steps: a positive integer or None"),
])
def test_bad_arguments_raise_naming_them(kwargs, message):
    args = {"lr": 1e-3, **kwargs}
    with pytest.raises(ValueError, match=message):
        st.SCAPE(model().parameters(), **args)


def test_bad_params_raise_naming_the_tensor_or_group():
    m = model()
    with pytest.raises(ValueError, match=r"^params: 0.bias is on cpu, others on meta"):
        named = list(m.named_parameters())
        named[0] = ("0.weight", torch.nn.Parameter(torch.empty(16, 8, device="meta")))
        st.SCAPE(named, lr=1e-3)
    with pytest.raises(ValueError, match=r"^params: 0.weight is torch.float64"):
        st.SCAPE(model().double().named_parameters(), lr=1e-3)
    with pytest.raises(ValueError, match=r"^param_groups\[0\]: unknown key 'momentum'"):
        st.SCAPE([{"params": m.parameters(), "momentum": 0.9}], lr=1e-3)
    with pytest.raises(ValueError, match=r"^params: 0.weight appears twice"):
        named = list(m.named_parameters())
        st.SCAPE(named + named[:1], lr=1e-3)
    with pytest.raises(ValueError, match=r"^params: empty"):
        st.SCAPE([], lr=1e-3)


def test_nanogpt_style_groups_and_named_parameters():
    m = model()
    decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in m.named_parameters() if p.dim() < 2]
    opt = st.SCAPE([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0,
                                                              "sparsity": 0.0}], lr=1e-3, sparsity=0.9)
    assert [g["sparsity"] for g in opt.param_groups] == [0.9, 0.0]
    named = st.SCAPE(model().named_parameters(), lr=1e-3)
    by_name = {n: (g["sparsity"], g["weight_decay"]) for g in named.param_groups for n in g["names"]}
    assert by_name["0.weight"] == (0.99, 0.1) and by_name["0.bias"] == (0.0, 0.0)
    # A Sequential's LayerNorm is "1.weight": dense_tensors match names, so it stays sparse,
    # and as a vector it is not decayed.
    assert by_name["1.weight"] == (0.99, 0.0)


def test_frozen_and_gradientless_tensors_are_left_alone():
    m = model()
    m[0].bias.requires_grad_(False)
    opt = st.SCAPE(m.named_parameters(), lr=1e-2, sparsity=0.5, weight_decay=0.5)
    assert all(p is not m[0].bias for p in opt._tensors)
    frozen, unused = m[0].bias.detach().clone(), m[2].weight.detach().clone()
    for _ in range(3):
        opt.zero_grad()
        m[1](m[0](torch.randn(4, 8))).pow(2).mean().backward()  # m[2] takes no part
        opt.step()
    assert m[2].weight.grad is None
    assert torch.equal(m[0].bias, frozen) and torch.equal(m[2].weight, unused)  # not decayed either
    assert not torch.equal(m[0].weight, model()[0].weight)


def test_a_non_finite_gradient_without_a_scaler_raises_naming_the_step_and_changes_nothing():
    m = model()
    opt = st.SCAPE(m.parameters(), lr=1e-2, sparsity=0.5)
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
    before = [p.detach().clone() for p in m.parameters()]
    m[0].weight.grad[0, 0] = float("nan")
    with pytest.raises(st.NonFiniteGradient, match=r"^step 2: a gradient holds inf or NaN on rank\(s\) \[0\]"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert opt.steps_done == 1


@pytest.mark.parametrize("sharded, dtype", [(False, torch.float32), (True, torch.float32),
                                            (False, torch.bfloat16)])
def test_state_bytes_per_parameter_equal_the_closed_form(sharded, dtype):
    m = model().to(dtype)
    n = sum(p.numel() for p in m.parameters())
    opt = st.SCAPE(m.parameters(), lr=1e-3, sharded=sharded)
    # first moment 4 + residual 4 (+ carried momentum 4 when sharded, W = 1 here: its shard is
    # everything) + an fp32 master of 4 for a bf16 parameter + three packed masks of ceil(N/8)
    want = 4 + 4 + (4 if sharded else 0) + (4 if dtype != torch.float32 else 0) + 3 * math.ceil(n / 8) / n
    assert opt.state_bytes_per_parameter() == pytest.approx(want, rel=1e-12)


def test_the_optimizers_need_no_extension(tmp_path):
    """scape.torch.SCAPE runs with scape/_core absent (a copy of the package without it)."""
    import shutil
    package = Path(st.__file__).parent
    shutil.copytree(package, tmp_path / "scape", ignore=shutil.ignore_patterns("_core*", "__pycache__"))
    code = ("import sys, torch, scape.torch as st; m = torch.nn.Linear(4, 3); o = st.SCAPE(m.parameters(), lr=0.1);"
            "m(torch.randn(2, 4)).sum().backward(); o.step(); print(o.steps_done, 'scape._core' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "False"]


def test_the_example_trains_on_two_ranks_and_its_run_files_go_through_the_report(tmp_path, scape_binary):
    """examples/torch_nanogpt.py under torchrun (gloo), SCAPE 90% and AdamS, 60 steps each, then
    `python3 -m analysis report` on their run files."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for optimizer in ("scape", "adams"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
               str(REPO / "examples" / "torch_nanogpt.py"), "--optimizer", optimizer, "--steps", "60",
               "--eval-interval", "30", "--checkpoint-every", "30", "--out", str(tmp_path)]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert "completed after 60 steps" in result.stdout
    report = subprocess.run(["/usr/bin/python3", "-m", "analysis", "report", str(tmp_path), "--out",
                             str(tmp_path / "report")], capture_output=True, text=True, cwd=REPO, timeout=300,
                            env=dict(os.environ, SCAPE_BINARY=scape_binary, MPLBACKEND="Agg"))
    assert report.returncode == 0, report.stderr[-2000:]
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "2 run file(s) read, 0 unreadable, 0 failed" in summary
    assert "SCAPE(adams) s=0.9 | completed" in summary and "AdamS | completed" in summary
    import h5py
    sent = {}
    for name in ("torch-nanogpt-scape-0.9", "torch-nanogpt-adams"):
        with h5py.File(tmp_path / f"{name}.h5", "r") as f:
            sent[name] = f["metrics/bytes_sent"][()]
            assert len(sent[name]) == 60 and f["final/params"].shape[0] > 0
    # 10% of the matrices plus the dense vectors, and the mask: well under a fifth of dense's bytes
    assert 0 < sent["torch-nanogpt-scape-0.9"][1:].mean() < sent["torch-nanogpt-adams"].mean() / 5
