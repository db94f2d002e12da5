"""The Python API: ampkit.bench.run / ampkit.train.run / ampkit.doctor.run write the same run
directory as the commands and return the summary; task objects included."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import ampkit.bench
import ampkit.doctor
import ampkit.train
from ampkit.api import bench, doctor, train
from ampkit.bench.api import run as bench_run
from ampkit.diagnostics.api import run as diagnosis_run
from ampkit.errors import UsageError
from ampkit.tasks.builtin import builtin_task
from ampkit.train.api import run as train_run
from ampkit.train.doctor_api import run as doctor_run

QUICK = {"budget_s": 0.5, "min_steps": 3, "max_steps": 10, "warmup_steps": 1}


def test_the_packages_expose_the_api():
    assert (ampkit.bench.run, ampkit.train.run, ampkit.doctor.run) == (bench, train, doctor)
    assert (bench, train, doctor) == (bench_run, train_run, doctor_run)


def test_the_packages_never_import_the_api_module_back():
    # `ampkit.api` sits above bench, train and diagnostics: importing them must not load it (it did: a cycle).
    code = "import sys, ampkit.bench, ampkit.train, ampkit.doctor; print('ampkit.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_train_a_task_object_then_resume_it(tmp_path):
    task = builtin_task("mlp", hidden=32)
    out = tmp_path / "run"
    first = ampkit.train.run(task, out=out, steps=6, stop_after=0, batch_size=8, eval_batches=1, warmup_steps=1)
    assert first["status"] == "completed" and first["steps"] == 6 and first["unit"] == "samples"
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    again = ampkit.train.run(task, resume=out, steps=8)
    assert again["steps"] == 8 and again["config"]["model"]["task"] == "python:mlp"


def test_bench_pickles_a_task_object_for_its_workers(tmp_path):
    summary = ampkit.bench.run(builtin_task("mlp", hidden=16), out=tmp_path / "b", precisions="fp32", **QUICK)
    assert summary["unit"] == "samples" and summary["recommendation"]["precision"] == "fp32"
    assert (tmp_path / "b" / "workers" / "task.pkl").is_file() and (tmp_path / "b" / "report.html").is_file()


def test_bench_of_a_task_defined_in_the_users_own_script(tmp_path):
    script = tmp_path / "my_bench.py"
    script.write_text(
        textwrap.dedent("""
        import json, sys, torch
        from torch import nn
        from torch.nn import functional as F
        import ampkit.bench
        from ampkit.tasks import SupervisedTask

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 3)

            def forward(self, x):
                return self.fc(x)

        def data(seed):
            g = torch.Generator().manual_seed(seed)
            return torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)

        if __name__ == "__main__":
            task = SupervisedTask(name="script-net", model=Net, loss_fn=F.cross_entropy, train=data(0), held=data(1))
            summary = ampkit.bench.run(task, out=sys.argv[1], precisions="fp32", budget_s=0.3, min_steps=3,
                                       max_steps=6, warmup_steps=1)
            print(json.dumps({"status": summary["precisions"][0]["status"], "unit": summary["unit"]}))
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"status": "ok", "unit": "samples"}


def test_doctor_a_task_by_name(tmp_path):
    summary = ampkit.doctor.run(
        "mlp", out=tmp_path / "d", precision="bf16-mixed", steps=2, smoke_steps=5, fidelity=False
    )
    assert summary["command"] == "doctor" and summary["task"]["name"] == "mlp"
    assert (tmp_path / "d" / "report.html").is_file()
    # without from_run it is the plain diagnosis (diagnostics' own entry): the same run, loss for loss
    plain = diagnosis_run("mlp", out=tmp_path / "p", precision="bf16-mixed", steps=2, smoke_steps=5, fidelity=False)
    assert plain["run"]["losses"] == summary["run"]["losses"] and plain["replay"] is None


def test_a_mistyped_setting_is_the_commands_one_line_error(tmp_path):
    with pytest.raises(UsageError, match="unknown setting 'stepz' in the keyword arguments"):
        ampkit.train.run("mlp", out=tmp_path / "x", stepz=3)
    with pytest.raises(UsageError, match="--lr must be a finite number|lr.*finite"):
        ampkit.train.run("mlp", out=tmp_path / "y", lr=float("inf"))
