"""Per-process start-up: what a bench worker and a plain train run load, checked in fresh processes.

torch (~1 s) is the floor. torch._dynamo (~0.8 s more) is not avoidable in a run: torch 2.13's
`Optimizer.__init__` calls `add_param_group`, `zero_grad` and `step` are wrapped to import it (and so
does `nn.init` on the meta device), so a run loads it whatever its features; importing the worker
does not. What ampkit can avoid it must: the optional extras (transformers, torchao, peft,
bitsandbytes), matplotlib (only the reports draw), TensorBoard, W&B and MLflow (only their `--log`), and rich
(the parent draws the progress bars, not the worker).
"""

from __future__ import annotations

import json
import subprocess
import sys

AVOIDABLE = ("transformers", "torchao", "peft", "bitsandbytes", "matplotlib", "tensorboard", "wandb", "mlflow", "rich")


def _loaded(code: str) -> dict[str, bool]:
    """Which of `AVOIDABLE` (and torch._dynamo) a fresh interpreter has loaded after running `code`."""
    probe = code + "\nimport json, sys\nprint(json.dumps({m: m in sys.modules for m in WATCH}))"
    watch = f"WATCH = {[*AVOIDABLE, 'torch._dynamo']!r}\n"
    proc = subprocess.run([sys.executable, "-c", watch + probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_bench_worker_imports_no_extra_and_no_dynamo():
    loaded = _loaded("import ampkit.bench.worker")
    assert not any(loaded.values()), loaded


def test_a_plain_train_run_loads_no_extra():
    loaded = _loaded(
        "from ampkit.train import TrainConfig, build_run\n"
        "objs = build_run(TrainConfig.of(steps=1, model='tiny', seq_len=32, batch_size=2, fit_check=False))\n"
        "objs.trainer.train_step()"
    )
    assert not any(loaded[m] for m in AVOIDABLE), loaded


def test_a_stop_while_the_worker_imports_torch_ends_it_in_one_line(tmp_path):
    """The parent passes a stop on whenever it comes, also while the worker still imports torch: a real SIGINT,
    sent by the worker process to itself as torch's C++ core starts to load, ends it with 130 and its one
    line (it used to unwind through torch's C++ initialisation: "terminate called after throwing an instance
    of 'pybind11::error_already_set'", an abort, seen in tests/reliability/test_interrupts.py)."""
    code = (
        "import os, runpy, signal, sys\n"
        "class StopAtTorchCore:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch._C':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, StopAtTorchCore())\n"
        f"sys.argv = ['worker', {str(tmp_path / 'job.json')!r}]\n"
        "runpy.run_module('ampkit.bench.worker', run_name='__main__', alter_sys=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert proc.stderr.strip() == "ampkit bench worker: interrupted by SIGINT"
    assert not (tmp_path / "job.json").exists()  # it stopped before reading its job
