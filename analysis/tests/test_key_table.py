"""Which optimizer types read which key: run files carry the table (attribute `optimizer_keys`,
written by scape from its key table), so a report of them needs no scape binary; files written
before the attribute existed fall back to `scape schema`, and without a binary the error names them.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import h5py
import pytest

from conftest import QUADRATIC, REPO, run_scape

PYTHON = sys.executable
NO_BINARY = "/nonexistent/scape"


def env_without_scape():
    """The environment of a laptop without scape: SCAPE_BINARY names no file, PATH holds no scape."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not os.access(os.path.join(p, "scape"), os.X_OK))
    return dict(os.environ, SCAPE_BINARY=NO_BINARY, PATH=path, PYTHONPATH=str(REPO), MPLBACKEND="Agg")


def report(inputs, out, env):
    """`python3 -m analysis report INPUTS --out OUT --no-figures --quiet` in `env`."""
    return subprocess.run([PYTHON, "-m", "analysis", "report", *map(str, inputs), "--out", str(out), "--no-figures",
                           "--quiet"], capture_output=True, text=True, cwd=REPO, timeout=300, env=env)


def edit_attrs(path, config=None, **attrs):
    """Rewrites a closed run file's root attributes: `config` merged into the optimizer section of
    the config; an attribute given as None is deleted."""
    with h5py.File(path, "r+") as f:
        if config:
            c = json.loads(f.attrs["config"])
            c["optimizer"].update(config)
            f.attrs["config"] = json.dumps(c)
        for key, value in attrs.items():
            if value is None:
                del f.attrs[key]
            else:
                f.attrs[key] = value


@pytest.fixture(scope="module")
def keyed_runs(scape, tmp_path_factory):
    """Three quadratic runs (two AdamS, one SCAPE 0.99). The AdamS configs are given SCAPE-only keys
    with different values, as the resolved configs of older scapes held them: the table must drop
    them, or the two AdamS runs would differ in mask_lag."""
    d = tmp_path_factory.mktemp("keyed") / "runs"
    d.mkdir()
    base = dict(QUADRATIC, steps=12)
    run_scape(scape, base, d / "adams-a.h5", "optimizer.type=adams")
    run_scape(scape, base, d / "adams-b.h5", "optimizer.type=adams", "seed=4")
    run_scape(scape, base, d / "scape99.h5", "optimizer.type=scape", "optimizer.sparsity=0.99")
    edit_attrs(d / "adams-a.h5", config={"mask_lag": 0, "sparsity": 0.9, "residual": True})
    edit_attrs(d / "adams-b.h5", config={"mask_lag": 1, "sparsity": 0.99, "residual": False})
    return d


def test_run_files_carry_the_table_of_scape_schema(scape, keyed_runs):
    """Every fresh run file's optimizer_keys attribute is `scape schema`'s x-applies-to."""
    from analysis import runs

    runs.optimizer_key_types.cache_clear()
    try:
        schema = runs.optimizer_key_types()  # SCAPE_BINARY is the built scape here
    finally:
        runs.optimizer_key_types.cache_clear()
    for path in sorted(keyed_runs.glob("*.h5")):
        run = runs.load_run(path)
        assert run.optimizer_keys == schema, path
        assert not run.config_as_given


def test_report_without_a_binary_equals_the_report_with_one(keyed_runs, tmp_path, monkeypatch):
    """The report of files that carry the table, on a machine without scape, is the report the
    binary's `scape schema` gives for the same files without the table."""
    runs_dir = tmp_path / "runs"
    shutil.copytree(keyed_runs, runs_dir)
    tables = {}
    for path in runs_dir.glob("*.h5"):
        with h5py.File(path, "r") as f:
            tables[path] = f.attrs["optimizer_keys"]
        edit_attrs(path, optimizer_keys=None)
    with_binary = report([runs_dir], tmp_path / "with-binary", dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg"))
    assert with_binary.returncode == 0, with_binary.stderr

    for path, table in tables.items():
        edit_attrs(path, optimizer_keys=table)
    without = report([runs_dir], tmp_path / "without-binary", env_without_scape())
    assert without.returncode == 0, without.stderr
    assert "SCAPE_BINARY" not in without.stderr and "optimizer_keys" not in without.stderr, without.stderr

    for name in ("summary.md", "summary.csv"):
        assert (tmp_path / "without-binary" / name).read_text() == (tmp_path / "with-binary" / name).read_text(), name
    summary = (tmp_path / "without-binary" / "summary.md").read_text()
    assert "mask_lag" not in summary and "residual=" not in summary  # the AdamS runs' SCAPE keys were dropped
    assert "adams-a.h5" in summary and "adams-b.h5" in summary and "SCAPE(adams) s=0.99" in summary

    # In-process too: a report of such files never asks for the binary.
    from analysis import runs
    from analysis.report import write_report

    def no_binary(*_):
        raise AssertionError("the report looked for the scape binary")

    monkeypatch.setattr(runs, "scape_binary", no_binary)
    monkeypatch.setattr(runs, "optimizer_key_types", no_binary)
    _, text = write_report([runs_dir], tmp_path / "in-process", figures=False)
    assert "adams-a.h5" in text
    cfg = runs.effective_config(runs.load_run(runs_dir / "adams-a.h5"))
    assert "optimizer.mask_lag" not in cfg and "optimizer.sparsity" not in cfg and cfg["optimizer.type"] == "adams"


def test_files_without_the_table_and_no_binary_are_named(keyed_runs, tmp_path, monkeypatch):
    """Older files (no optimizer_keys attribute) need `scape schema`; without a binary the error
    names each of them, says why and how to go on, and leaves the files that carry it unnamed."""
    runs_dir = tmp_path / "runs"
    shutil.copytree(keyed_runs, runs_dir)
    for name in ("adams-a.h5", "scape99.h5"):
        edit_attrs(runs_dir / name, optimizer_keys=None)
    proc = report([runs_dir], tmp_path / "out", env_without_scape())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr
    assert "2 run file(s) lack the 'optimizer_keys' attribute" in err, err
    assert str(runs_dir / "adams-a.h5") in err and str(runs_dir / "scape99.h5") in err, err
    assert "adams-b.h5" not in err, err
    assert "SCAPE_BINARY" in err and NO_BINARY in err and "leave these files out" in err, err
    assert "Traceback" not in err, err

    from analysis import runs

    runs.optimizer_key_types.cache_clear()
    monkeypatch.setenv("SCAPE_BINARY", NO_BINARY)
    try:
        with pytest.raises(runs.ScapeBinaryError, match="adams-a.h5") as e:
            runs.effective_config(runs.load_run(runs_dir / "adams-a.h5"))
        assert "optimizer_keys" in str(e.value) and "SCAPE_BINARY" in str(e.value)
        runs.effective_config(runs.load_run(runs_dir / "adams-b.h5"))  # carries the table: no binary needed
    finally:
        runs.optimizer_key_types.cache_clear()


def test_a_malformed_table_is_named(tmp_path):
    """An optimizer_keys attribute that is not {key: [types]} makes the file unreadable, with the reason."""
    from analysis.runs import load_runs
    from conftest import gpt_config, write_run_file

    for name, table in (("not-json.h5", "{lr: adams"), ("not-lists.h5", '{"lr": "adams"}'), ("list.h5", "[]")):
        write_run_file(tmp_path / name, gpt_config("adams", 1, 1e-3), val_loss=[2.0])
        edit_attrs(tmp_path / name, optimizer_keys=table)
    runs, problems = load_runs([tmp_path])
    assert runs == []
    assert sorted(p.name for p, _ in problems) == ["list.h5", "not-json.h5", "not-lists.h5"]
    for path, message in problems:
        assert message.startswith(f"{path}: the 'optimizer_keys' attribute is not {{key: [optimizer types]}}"), message


def test_files_of_the_python_writer_need_no_binary(tmp_path):
    """scape.run_file.RunFileWriter stores the config as given and says so (config_as_given):
    the report drops none of its keys and needs no scape binary."""
    spec = importlib.util.spec_from_file_location("scape_run_file", REPO / "python" / "scape" / "run_file.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    for name, optimizer in (("adams", {"type": "adams", "lr": 1e-3}),
                            ("scape99", {"type": "scape", "lr": 1e-3, "sparsity": 0.99, "inner": "adams"})):
        config = {"name": "loop", "seed": 1, "steps": 5, "optimizer": optimizer}
        with module.RunFileWriter(runs_dir / f"{name}.h5", config=config, tensors=[("w", 64)], world_size=2) as log:
            for t in range(1, 6):
                log.write_step(t, {"loss": 2.0 / t, "bytes_sent": 512.0 if name == "adams" else 16.0})
            log.close()
    from analysis.runs import effective_config, load_run

    run = load_run(runs_dir / "scape99.h5")
    assert run.config_as_given and run.optimizer_keys is None
    assert effective_config(run)["optimizer.sparsity"] == 0.99
    proc = report([runs_dir], tmp_path / "out", env_without_scape())
    assert proc.returncode == 0, proc.stderr
    assert "SCAPE(adams) s=0.99" in (tmp_path / "out" / "summary.md").read_text()


def test_keys_recorded_only_away_from_their_defaults_compare_at_the_default(scape, tmp_path):
    """optimizer.hierarchy and optimizer.overlap_grad_reduce are written only when not at their
    defaults (older runs keep their ids): a run without one ran at the default, so flat against
    hierarchical is a setting that differs, and an optimizer key counts only for the types that
    read it. topology.ranks_per_node stays as recorded: a run without it (whose flat training
    does not depend on it) still compares with runs of nodes of G."""
    from analysis.runs import effective_config, load_run
    from analysis.tables import varying_keys

    base = {"name": "q", "seed": 1, "workers": 4, "steps": 3, "model": {"type": "quadratic", "size": 64},
            "optimizer": {"type": "scape", "sparsity": 0.9, "lr": 1e-3}}
    flat = run_scape(scape, dict(base, topology={"ranks_per_node": 2}), tmp_path / "flat.h5")
    node = run_scape(scape, dict(base, topology={"ranks_per_node": 2},
                                 optimizer=dict(base["optimizer"], hierarchy="node", rail_split="rows")),
                     tmp_path / "node.h5")
    alone = run_scape(scape, dict(base, optimizer={"type": "adams", "lr": 1e-3}), tmp_path / "alone.h5")
    runs = [load_run(p) for p in (flat, node, alone)]
    configs = [effective_config(r) for r in runs]
    assert [c["optimizer.hierarchy"] for c in configs] == ["flat", "node", "flat"]
    assert [c.get("topology.ranks_per_node") for c in configs] == [2, 2, None]
    assert configs[2]["optimizer.overlap_grad_reduce"] is False  # dense reads it
    assert "optimizer.overlap_grad_reduce" not in configs[0]     # SCAPE does not
    varying = varying_keys(runs)
    assert varying["optimizer.hierarchy"] == ["flat", "node"] and "topology.ranks_per_node" not in varying
