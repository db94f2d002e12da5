"""examples/: one documented TOML per command, each accepted by its command's config (and the analytic
ones run); the Python-API example (`examples/custom_loop.py`) runs as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampkit.bench import BenchConfig
from ampkit.config import config_layout, flat_settings, load_toml, resolve_config
from ampkit.diagnostics.config import DoctorConfig
from ampkit.plan.config import KvConfig, PlanConfig
from ampkit.train import TrainConfig

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
from ampkit.cli.hw import HwConfig  # noqa: E402

CONFIGS = {
    "train": TrainConfig,
    "bench": BenchConfig,
    "doctor": DoctorConfig,
    "plan": PlanConfig,
    "kv": KvConfig,
    "hw": HwConfig,
}


def test_every_command_has_one_example():
    assert {p.stem for p in EXAMPLES.glob("*.toml")} == set(CONFIGS)


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_example_is_documented_and_accepted_by_its_config(command):
    path = EXAMPLES / f"{command}.toml"
    text = path.read_text(encoding="utf-8")
    assert text.startswith(f"# ampkit {command} --config examples/{command}.toml")  # says how to use it
    cls = CONFIGS[command]
    settings = flat_settings(cls, load_toml(path), source=str(path))  # a [section]'s keys by their own names
    assert settings, "an example sets something"
    lines = {line.split("=")[0].strip(): line for line in text.splitlines() if "=" in line and not line.startswith("#")}
    undocumented = [key for key in settings if "#" not in lines[key]]
    assert not undocumented, f"settings without a comment: {undocumented}"
    config = resolve_config(cls, toml_path=path)  # unknown keys or wrong types raise UsageError
    for key, value in settings.items():
        section = config_layout(cls).settings[key].section
        holder = getattr(config, section) if section else config
        assert getattr(holder, key) == value or key == "precision", key  # precision is canonicalized


@pytest.mark.parametrize("command", ["plan", "kv"])
def test_analytic_examples_run(tmp_path, capsys, command):
    from ampkit.cli import main

    assert main([command, "--config", str(EXAMPLES / f"{command}.toml"), "--json", "--out", str(tmp_path / "r")]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["model"] == "7b"


def test_custom_loop_example_runs_and_locates_the_fault():
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "custom_loop.py"),
            "--precision",
            "fp16-mixed",
            "--steps",
            "15",
            "--log-every",
            "5",
            "--inject",
            "layers.1.fc2:backward:inf@6",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert elapsed < 30, f"the example took {elapsed:.1f} s"
    assert summary["precision"] == "fp16-mixed" and summary["steps"] == 15
    assert summary["final_loss"] < 0.5 * summary["first_loss"]  # it learns
    # the injected inf made the scaler skip exactly that step, and the locator named module and phase
    assert summary["skipped_steps"] == 1 and summary["final_loss_scale"] == 2048.0
    assert summary["findings"] == [{"step": 6, "module": "layers.1.fc2", "phase": "backward", "stepped": False}]
    assert set(summary["layer_grad_norms"]) == {"embed", "layers.0", "layers.1", "head"}
    assert "the backward of layers.1.fc2 (Linear)" in proc.stdout


def test_readme_python_api_snippet_compiles_and_imports():
    """The README's loop snippet is the docs' snippet; it compiles and every ampkit name it imports exists."""
    import ast
    import importlib

    root = EXAMPLES.parent
    readme = (root / "README.md").read_text()
    snippet = readme[readme.index("```python") + len("```python") :]
    snippet = snippet[: snippet.index("```")]
    assert snippet in (root / "docs" / "python_api.md").read_text()
    tree = ast.parse(snippet)
    imported = [
        (node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    ]
    assert imported and all(hasattr(importlib.import_module(mod), name) for mod, name in imported)
    policy_calls = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "policy"
    }
    from ampkit.precision import Precision

    assert policy_calls and all(hasattr(Precision, name) for name in policy_calls)
