"""Bad inputs raise ValueError naming the argument, with the text `scape run` gives for the same
config error."""
import json

import numpy as np
import pytest

import scape
from conftest import run_scape, write_json

LAYOUT = [("w", (4, 8), True), ("b", (8,), False)]
N = 40


def simulator(tmp_path, **kw):
    return scape.Simulator(LAYOUT, 2, {"type": "scape", "sparsity": 0.9}, log=str(tmp_path / "r.h5"), steps=4, **kw)


def test_wrong_dtype_names_the_argument(tmp_path):
    with simulator(tmp_path) as sim:
        with pytest.raises(ValueError, match=r"^grads: dtype float64, expected float32$"):
            sim.step(np.zeros((2, N)))
        with pytest.raises(ValueError, match=r"^grads\[1\]: dtype int32, expected float32$"):
            sim.step([np.zeros(N, np.float32), np.zeros(N, np.int32)])


def test_non_contiguous_names_the_argument(tmp_path):
    g = np.zeros((2, 2 * N), np.float32)
    with simulator(tmp_path) as sim:
        with pytest.raises(ValueError, match=r"^grads: not contiguous"):
            sim.step(g[:, ::2])
        with pytest.raises(ValueError, match=r"^grads\[0\]: not contiguous"):
            sim.step([g[0, ::2], g[1, ::2]])


def test_wrong_shape_names_the_argument(tmp_path):
    with simulator(tmp_path) as sim:
        with pytest.raises(ValueError, match=r"^grads: shape \[3, 40\], expected \[2, 40\]"):
            sim.step(np.zeros((3, N), np.float32))
        with pytest.raises(ValueError, match=r"^grads\[1\]: 39 values, the layout has 40$"):
            sim.step([np.zeros(N, np.float32), np.zeros(N - 1, np.float32)])
        with pytest.raises(ValueError, match=r"^grads: 1 gradients for 2 workers$"):
            sim.step([np.zeros(N, np.float32)])
        with pytest.raises(ValueError, match=r"^losses: 3 values for 2 workers$"):
            sim.step(np.zeros((2, N), np.float32), losses=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"^params: 41 values, the layout has 40$"):
        simulator(tmp_path, params=np.zeros(N + 1, np.float32))


def test_wrong_device_names_the_argument(tmp_path):
    torch = pytest.importorskip("torch")
    with simulator(tmp_path) as sim:
        with pytest.raises(ValueError, match=r"^grads\[0\]: on meta"):
            sim.step([torch.empty(N, device="meta"), torch.zeros(N)])


def test_bad_layouts(tmp_path):
    with pytest.raises(ValueError, match=r"^layout\[1\]: expected \(name, shape, decay\)"):
        scape.Simulator([("w", (4,), True), ("x",)], 2, log=str(tmp_path / "a.h5"))
    with pytest.raises(ValueError, match=r"^layout\[1\]: .*duplicate"):
        scape.Simulator([("w", (4,), True), ("w", (4,), True)], 2, log=str(tmp_path / "b.h5"))
    with pytest.raises(ValueError, match=r"^layout: a scape.Layout"):
        scape.Simulator(42, 2, log=str(tmp_path / "c.h5"))


@pytest.mark.parametrize("optimizer,network", [
    ({"type": "scape", "sparsty": 0.9}, None),
    ({"type": "scape", "sparsity": 1.5}, None),
    ({"type": "scape", "lr": "fast"}, None),
    ({"type": "adamx"}, None),
    ({"type": "scape"}, {"preset": "infiniband"}),
    ({"type": "scape", "lr": float("nan")}, None),
])
def test_config_errors_read_as_scape_runs(optimizer, network, tmp_path, scape_binary):
    config = {"name": "bad", "workers": 2, "steps": 4, "model": {"type": "quadratic", "size": 64},
              "optimizer": optimizer}
    if network is not None:
        config["network"] = network
    with pytest.raises(ValueError) as raised:
        scape.Simulator(LAYOUT, 2, optimizer, network, log=str(tmp_path / "x.h5"), steps=4)
    message = str(raised.value)
    if any(isinstance(v, float) and v != v for v in optimizer.values()):
        assert message.startswith("config: not representable as JSON")
        return
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    result = run_scape(scape_binary, "validate", path, check=False)
    assert result.returncode == 2
    assert message in result.stderr + result.stdout, (message, result.stderr)
    assert not (tmp_path / "x.h5").exists()  # nothing written


def test_scape_run_refuses_external_gradients(tmp_path, scape_binary):
    path = write_json(tmp_path / "e.json", {"workers": 2, "steps": 2, "model": {"type": "external"}})
    result = run_scape(scape_binary, "run", path, "--out", tmp_path / "e.h5", "--quiet", check=False)
    assert result.returncode == 2
    assert 'model.type: "external"' in result.stderr


def test_steps_past_the_end_and_after_close(tmp_path):
    sim = scape.Simulator(LAYOUT, 2, {"type": "adams"}, log=str(tmp_path / "r.h5"), steps=1)
    sim.step(np.zeros((2, N), np.float32))
    with pytest.raises(RuntimeError, match="all 1 steps of the run were taken"):
        sim.step(np.zeros((2, N), np.float32))
    assert sim.close()["status"] == "completed"
    with pytest.raises(RuntimeError, match="closed"):
        sim.step(np.zeros((2, N), np.float32))


def test_nan_gradient_stops_the_run_as_diverged(tmp_path):
    from run_files import status
    g = np.zeros((2, N), np.float32)
    with scape.Simulator(LAYOUT, 2, {"type": "scape", "sparsity": 0.5}, log=str(tmp_path / "n.h5"), steps=5) as sim:
        sim.step(g)
        g[1, 3] = np.nan
        _, metrics = sim.step(g)
        assert metrics["diverged"]
        with pytest.raises(RuntimeError, match="stopped at step 2"):
            sim.step(g)
        outcome = sim.close()
    assert outcome["status"] == "diverged"
    assert outcome["steps_completed"] == 2
    assert status(tmp_path / "n.h5") == "diverged"


def test_a_nan_loss_the_caller_gives_stops_the_run_as_diverged(tmp_path):
    """losses=None is "no loss" (train_loss NaN, the run goes on); a NaN among the losses given
    is a diverged step, as a NaN gradient is (it was taken for "no loss" until 2026-12-07)."""
    from run_files import status
    g = np.zeros((2, N), np.float32)
    with scape.Simulator(LAYOUT, 2, {"type": "adams"}, log=str(tmp_path / "n.h5"), steps=4) as sim:
        _, metrics = sim.step(g)
        assert not metrics["diverged"]
        _, metrics = sim.step(g, losses=[1.5, 1.25])
        assert not metrics["diverged"]
        _, metrics = sim.step(g, losses=[float("nan"), 1.0])
        assert metrics["diverged"]
        outcome = sim.close()
    assert outcome["status"] == "diverged" and outcome["steps_completed"] == 3
    assert "step 3" in outcome["error"]
    assert status(tmp_path / "n.h5") == "diverged"


def test_a_failing_eval_closes_the_run_as_failed(tmp_path):
    from run_files import status

    def evaluate(params):
        raise KeyError("no validation data")

    sim = scape.Simulator(LAYOUT, 2, {"type": "adams"}, log=str(tmp_path / "f.h5"), steps=3, eval=evaluate,
                          eval_interval=1)
    with pytest.raises(RuntimeError, match=r"(?s)step 1: eval: .*no validation data"):
        sim.step(np.zeros((2, N), np.float32))
    assert status(tmp_path / "f.h5") == "failed"


def test_a_callers_exception_is_the_runs_error(tmp_path):
    from run_files import status
    import h5py
    with pytest.raises(KeyError):
        with scape.Simulator(LAYOUT, 2, {"type": "adams"}, log=str(tmp_path / "k.h5"), steps=3) as sim:
            sim.step(np.zeros((2, N), np.float32))
            raise KeyError("batch 2 missing")
    assert status(tmp_path / "k.h5") == "failed"
    with h5py.File(tmp_path / "k.h5", "r") as f:
        error = f.attrs["error"]
        assert (error.decode() if isinstance(error, bytes) else error) == "step 2: KeyError: 'batch 2 missing'"


def test_simulate_records_a_failing_loss_function(tmp_path):
    torch = pytest.importorskip("torch")
    import scape.torch as st
    from run_files import status
    model = torch.nn.Linear(4, 2)

    def loss_fn(out, y):
        raise ArithmeticError("loss exploded")

    batches = lambda t: (torch.zeros(2, 3, 4), torch.zeros(2, 3, 2))  # noqa: E731
    with pytest.raises(ArithmeticError):
        st.simulate(model, loss_fn, batches, workers=2, steps=3, log=str(tmp_path / "l.h5"), quiet=True)
    assert status(tmp_path / "l.h5") == "failed"
