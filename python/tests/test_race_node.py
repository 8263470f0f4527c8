"""One node of the race (netlab/race_node.py, netlab/race_arms.py; `scripts/netlab race`) on two
gloo ranks over loopback, no namespaces: a training run writes one row an evaluation step with
the bytes each arm sends counted as docs/NETLAB.md says (DDP's ring of every gradient, PowerSGD's
P and Q by torch's own compression rule, torchft's DiLoCo one all-reduce of the model every 10
steps, SCAPE's from its own tensors), evaluation steps on the syncs, and a measured step time.
The race itself, on the netlab, is a documented command and not a test."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

from conftest import REPO, process_output  # noqa: E402
from netlab import race_arms, race_plan  # noqa: E402
from tiny_gpt import TinyGPT  # noqa: E402

MODEL = ["--width", "32", "--layers", "1", "--batch", "2", "--block", "16", "--val-sequences", "8"]


def node(tmp_path, *args, port):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_port", str(port), "-m", "netlab.race_node", *map(str, args), *MODEL]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert done.returncode == 0, process_output(done)
    return done


def elements(vocab):
    model = TinyGPT(vocab=vocab, block=16, n_embd=32, n_head=4, n_layer=1, seed=1)
    return model, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arm,port", [("ddp-adamw", 29631), ("torchft-diloco", 29632), ("scape-99", 29633),
                                      ("ddp-powersgd-r1", 29635)])
def test_a_training_run_writes_its_evaluations(tmp_path, arm, port):
    out = tmp_path / "race.csv"
    node(tmp_path, "--mode", "train", "--arm", arm, "--steps", 20, "--eval-points", 4, "--lr", "2e-3",
         "--rate-mbit", 100, "--budget-s", 7.5, "--out", out, port=port)
    rows = race_plan.read(out)
    expected_steps = [10, 20] if arm == "torchft-diloco" else [5, 10, 15, 20]  # on the syncs of H = 10
    assert [r["step"] for r in rows] == expected_steps
    assert all(r["arm"] == arm and r["planned_steps"] == 20 and r["budget_s"] == 7.5 for r in rows)
    assert all(a["wall_s"] < b["wall_s"] for a, b in zip(rows, rows[1:]))
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] + 0.5  # a loss, finite, of the same model
    _, n = elements(race_arms.char_corpus()[1])
    if arm == "ddp-adamw":
        assert [r["bytes_sent"] for r in rows] == [round(race_arms.ring_bytes(n, 2) * r["step"]) for r in rows]
    elif arm == "torchft-diloco":  # one fp32 all-reduce of every parameter a sync
        assert [r["bytes_sent"] for r in rows] == [round(race_arms.ring_bytes(n, 2) * r["step"] / 10) for r in rows]
    elif arm == "ddp-powersgd-r1":  # steps 1 and 2 plain (start_powerSGD_iter = 2), then P and Q of rank 1
        model, _ = elements(race_arms.char_corpus()[1])
        dense, low = race_arms.ring_bytes(n, 2), race_arms.ring_bytes(race_arms.powersgd_elements(model, 1), 2)
        assert [r["bytes_sent"] for r in rows] == [round(2 * dense + (r["step"] - 2) * low) for r in rows]
    else:
        assert 0 < rows[-1]["bytes_sent"] < 0.2 * race_arms.ring_bytes(n, 2) * 20


def test_powersgd_on_a_model_of_several_buckets(tmp_path):
    """The race's model has more gradient bytes than DDP's 1 MiB first bucket. With the default
    buckets, PowerSGD's per-bucket all-reduces reached gloo in different orders on the two ranks
    and the run aborted ("Received data size doesn't match expected size"); the arm now puts
    every gradient in one bucket."""
    model = TinyGPT(vocab=race_arms.char_corpus()[1], block=64, n_embd=128, n_head=4, n_layer=4, seed=1)
    assert 4 * sum(p.numel() for p in model.parameters()) > 2 * 2 ** 20
    out = tmp_path / "m.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--master_port",
           "29636", "-m", "netlab.race_node", "--mode", "measure", "--arm", "ddp-powersgd-r4", "--measure-steps", "6",
           "--out", str(out), "--width", "128", "--layers", "4", "--batch", "2", "--block", "64"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert done.returncode == 0, process_output(done)
    assert json.loads(out.read_text())["step_s"] > 0


def test_measure_writes_a_step_time(tmp_path):
    out = tmp_path / "m.json"
    node(tmp_path, "--mode", "measure", "--arm", "diloco-h10", "--measure-steps", 15, "--out", out, port=29634)
    found = json.loads(out.read_text())
    assert found["timed_steps"] == 20  # whole rounds of H = 10
    assert 0 < found["compute_s"] and 0 < found["step_s"] < 5


def test_powersgd_elements_follow_torchs_rule():
    model = TinyGPT(vocab=64, block=16, n_embd=32, n_head=4, n_layer=1, seed=1)
    # rank 1: wte 64x32 -> 96, wpe 16x32 -> 48, attn 96x32 -> 128, proj 32x32 -> 64, fc 128x32 -> 160,
    # fc_out 32x128 -> 160, head 64x32 -> 96 (each r(n+m)*2 < nm); biases and gains whole
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert race_arms.powersgd_elements(model, 1) == 96 + 48 + 128 + 64 + 160 + 160 + 96 + vectors
    # rank 4: every matrix still compresses (wpe: 4*48*2 = 384 < 512); at rank 8 wpe (768 >= 512) and
    # proj (8*64*2 = 1024, not under 1024: the boundary) go whole
    assert race_arms.powersgd_elements(model, 4) == 4 * (96 + 48 + 128 + 64 + 160 + 160 + 96) + vectors
    assert race_arms.powersgd_elements(model, 8) == 8 * (96 + 128 + 160 + 160 + 96) + 16 * 32 + 32 * 32 + vectors


def test_char_corpus_is_the_repositorys_prose():
    tokens, vocab = race_arms.char_corpus([REPO / "README.md"])
    text = (REPO / "README.md").read_bytes()
    assert len(tokens) == len(text) and vocab == len(set(text))
    assert tokens.max() == vocab - 1 and tokens.min() == 0


@pytest.mark.parametrize("native,port", [(False, 29638), (True, 29639)])
def test_the_gloo_bench_times_what_each_arm_sends(tmp_path, native, port):
    """netlab/gloo_bench_comm.py on two gloo ranks: scape.torch's four collectives, or with
    --native-all-reduce torch.distributed's all-reduce alone (the race's links, `race links`)."""
    h5py = pytest.importorskip("h5py")
    out = tmp_path / "bench.h5"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--master_port",
           str(port), "-m", "netlab.gloo_bench_comm", "--out", str(out), "--min-bytes", "1024", "--max-bytes", "4096",
           "--iters", "1", "--small-iters", "2", "--idle-gap-ms", "1"] + (["--native-all-reduce"] if native else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, process_output(done)
    with h5py.File(out) as f:
        kinds = [k.decode() if isinstance(k, bytes) else k for k in f["kind"][()]]
        regimes = {r.decode() if isinstance(r, bytes) else r for r in f["regime"][()]}
        assert f.attrs["collectives"] == ("torch.distributed" if native else "scape.torch")
        assert sorted(set(kinds)) == (["all_reduce"] if native else
                                      ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"])
        assert regimes == {"busy", "idle"} and len(kinds) == 2 * 2 * len(set(kinds))  # 1024 and 4096 bytes
        assert (f["time_s"][()] > 0).all() and set(f["payload_bytes"][()]) == {1024.0, 4096.0}
