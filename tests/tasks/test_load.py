"""`--task SPEC`: built-in names, FILE.py:FACTORY, package.module:FACTORY, keyword arguments from a
[task] table, and every mistake as one line naming the task (exit 2)."""

from __future__ import annotations

import json
import textwrap

import pytest

from ampkit.errors import UsageError
from ampkit.tasks import SupervisedTask
from ampkit.tasks.lm import LanguageModelTask
from ampkit.tasks.load import build_task, load_task
from ampkit.train.config import TrainConfig
from ampkit.train.features import Features

GOOD = """
import torch
from torch.nn import functional as F
from ampkit.tasks import SupervisedTask

def make_task(width: int = 4):
    x, y = torch.randn(16, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(16, dtype=torch.long)
    return SupervisedTask(name=f"toy{width}", model=lambda: torch.nn.Linear(3, width), loss_fn=F.cross_entropy,
                          train=(x, y), held=(x, y))

def broken():
    raise RuntimeError("no data on this machine")

def not_a_task():
    return 42

value = 3
"""


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "my_task.py"
    path.write_text(textwrap.dedent(GOOD))
    return path


def test_a_built_in_task_by_name_with_arguments():
    task = load_task("mlp", {"hidden": 32})
    assert isinstance(task, SupervisedTask) and task.unit == "samples"
    assert sum(p.numel() for p in task.build_model(device="cpu", seed=0).parameters()) == 128 * 32 + 32 + 32 * 10 + 10


def test_a_file_task_gets_its_keyword_arguments(task_file):
    task = load_task(f"{task_file}:make_task", {"width": 5})
    assert task.name == "toy5"


def test_a_module_task(monkeypatch, task_file):
    monkeypatch.syspath_prepend(str(task_file.parent))
    assert load_task("my_task:make_task").name == "toy4"


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (":nothing", "'nothing' does not exist in"),
        (":value", "'value' is not callable"),
        (":broken", "the factory raised RuntimeError: no data on this machine"),
        (":not_a_task", "the factory returned int, which lacks name, unit, build_model"),
    ],
)
def test_a_bad_factory_is_one_line_naming_the_task(task_file, suffix, message):
    with pytest.raises(UsageError, match=message) as caught:
        load_task(f"{task_file}{suffix}")
    assert str(caught.value).startswith(f"task {task_file}{suffix}:") and "\n" not in str(caught.value)


def test_missing_files_modules_and_unknown_names_are_refused(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_task(f"{tmp_path / 'nope.py'}:make_task")
    with pytest.raises(UsageError, match="no module named 'no_such_module'"):
        load_task("no_such_module:make_task")
    with pytest.raises(UsageError, match="unknown task 'resnet'.*mlp, convnet, encoder"):
        load_task("resnet")
    with pytest.raises(UsageError, match="task mlp has no argument .depth.; it accepts: features, hidden"):
        load_task("mlp", {"depth": 3})


def test_an_importing_file_that_fails_says_so(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("import not_installed_anywhere\n")
    with pytest.raises(UsageError, match="importing .*bad.py failed: ModuleNotFoundError"):
        load_task(f"{path}:make_task")


def test_language_model_flags_are_refused_with_another_task():
    with pytest.raises(UsageError, match="--model, --batching configure the language-model task"):
        from ampkit.train import Features

        build_task(TrainConfig.of(task="mlp", model="small", features=Features(batching="pack")).task_spec())
    assert isinstance(build_task(TrainConfig().task_spec()), LanguageModelTask)


def test_a_config_files_task_table_names_the_task_and_its_arguments(tmp_path, task_file):
    from ampkit.config import config_to_toml, resolve_config

    toml = tmp_path / "run.toml"
    toml.write_text(f'steps = 3\n\n[task]\nname = "{task_file}:make_task"\nwidth = 6\n')
    config = resolve_config(TrainConfig, toml_path=toml)
    assert config.model.task == f"{task_file}:make_task" and config.model.task_args == {"width": 6}
    assert build_task(config.task_spec()).name == "toy6"
    again = tmp_path / "again.toml"
    again.write_text(config_to_toml(config))  # --print-config output is accepted back
    assert resolve_config(TrainConfig, toml_path=again) == config
    assert json.loads(json.dumps(config.model.task_args)) == {"width": 6}


def test_each_command_hands_its_own_task_spec():
    """build_task reads a TaskSpec that each command's config builds from its own fields (no `getattr` on
    whichever config came in: train's batching lives in its features, doctor has no --data)."""
    import inspect

    import ampkit.tasks.load as load_mod
    from ampkit.bench.config import BenchConfig
    from ampkit.diagnostics.config import DoctorConfig
    from ampkit.tasks.load import TaskSpec

    train = TrainConfig.of(task="mlp", task_args={"hidden": 8}, features=Features(batching="pack", dedup="exact"))
    assert train.task_spec() == TaskSpec(
        task="mlp", task_args={"hidden": 8}, model="tiny", data="default", seq_len=256, batching="pack", dedup="exact"
    )
    assert BenchConfig.of(model="small", seq_len=64).task_spec() == TaskSpec(model="small", seq_len=64)
    assert DoctorConfig(smoke_seq_len=8).task_spec() == TaskSpec(model="tiny", seq_len=64, smoke_seq_len=8)
    assert "getattr(" not in inspect.getsource(load_mod.build_task) + inspect.getsource(load_mod._refuse_lm_options)


def test_a_python_calls_keyword_settings_win_over_its_config_file(tmp_path):
    from ampkit.tasks.load import keyword_config
    from ampkit.train.config import TrainConfig

    path = tmp_path / "run.toml"
    path.write_text("steps = 7\n[optimizer]\nlr = 0.5\n[data]\nseq_len = 48\n", encoding="utf-8")
    config = keyword_config(TrainConfig, "mlp", path, {"lr": 0.01, "seq_len": 16})
    assert config.optimizer.lr == 0.01 and config.data.seq_len == 16  # the keywords over the file
    assert config.steps == 7 and config.model.task == "mlp"  # the file's other settings kept
