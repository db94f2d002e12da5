"""`ampkit launch`: each target renders, parses (bash -n, YAML), runs under bash with the cluster's tools
stubbed, and hands torchrun and `ampkit train` the arguments the run config says."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from torch.distributed.run import get_args_parser

import ampkit.cli.launch as launch_cli
import ampkit.cli.train as train_cli
from ampkit.cli import main
from ampkit.config import replace_settings, resolve_config
from ampkit.train.config import TrainConfig

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is needed to parse the scripts")

# a quote, a semicolon and a space in a value: the quoting is what is tested
TRAIN_FLAGS = [
    "--precision", "bf16-mixed", "--steps", "17", "--lr", "3e-4", "--seed", "7", "--grad-accum", "2",
    "--seq-len", "64", "--data", "it's my corpus;rm -rf x.txt", "--activation-checkpointing", "full", "--compile",
    "--no-fit-check", "--parallel", "fsdp", "--reduce-dtype", "bf16",
]  # fmt: skip
STUBS = """
torchrun() { printf '%s\\0' "$@"; }
srun() { while [ "${1#--}" != "$1" ]; do shift; done; "$@"; }
scontrol() { printf 'node-a\\nnode-b\\n'; }
"""


def _render(capsys, *argv: str) -> str:
    assert main(["launch", *argv]) == 0
    return capsys.readouterr().out


def _bash_ok(text: str) -> None:
    done = subprocess.run([BASH, "-n"], input=text, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


def _run_stubbed(text: str, env: dict[str, str]) -> list[str]:
    """The arguments the script hands torchrun, the cluster's tools stubbed by shell functions."""
    done = subprocess.run(
        [BASH, "-c", STUBS + text], capture_output=True, env={"PATH": "/usr/bin:/bin", **env}, check=True
    )
    return done.stdout.decode().split("\0")[:-1]


def _expected_config(parse, *flags: str) -> TrainConfig:
    """The config launch resolved, minus the process counts (torchrun carries them to the ranks)."""
    config = resolve_config(TrainConfig, parse(launch_cli, "launch", "--print", "torchrun", *flags))
    return replace_settings(config, {"nproc_per_node": 0, "nnodes": 1})


def _train_config(parse, torchrun_args: list[str]):
    """torchrun's own parser on its arguments, then ampkit train's parser on the script's."""
    parsed = get_args_parser().parse_args(torchrun_args)
    assert parsed.module and parsed.training_script == "ampkit" and parsed.training_script_args[0] == "train"
    train_args = parse(train_cli, *parsed.training_script_args)
    return parsed, resolve_config(TrainConfig, train_args, toml_path=train_args.config)


@pytest.mark.parametrize("nnodes", [1, 3])
def test_torchrun_line_parses_and_carries_the_run(parse, capsys, nnodes):
    flags = [*TRAIN_FLAGS, "--nproc-per-node", "4", "--nnodes", str(nnodes)]
    text = _render(capsys, "--print", "torchrun", *flags)
    _bash_ok(text)
    args = _run_stubbed(text, {"MASTER_ADDR": "10.0.0.1"})
    parsed, config = _train_config(parse, args)
    assert (parsed.nnodes, parsed.nproc_per_node) == (str(nnodes), "4")
    if nnodes == 1:
        assert parsed.standalone
    else:
        assert (parsed.rdzv_backend, parsed.rdzv_endpoint) == ("c10d", "10.0.0.1:29500")
    assert config == _expected_config(parse, *flags)
    assert config.data.data == "it's my corpus;rm -rf x.txt"


def test_torchrun_on_several_nodes_needs_master_addr(capsys):
    text = _render(capsys, "--print", "torchrun", "--parallel", "ddp", "--nproc-per-node", "2", "--nnodes", "2")
    done = subprocess.run([BASH, "-c", STUBS + text], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0 and "set MASTER_ADDR to the first node" in done.stderr


def test_sbatch_script_rendezvous_at_the_first_node(parse, capsys):
    flags = [*TRAIN_FLAGS, "--nproc-per-node", "4", "--nnodes", "2"]
    slurm = ["--partition", "gpu", "--time", "1-00:00:00", "--account", "proj_1", "--run-dir", "/shared/runs/a b"]
    text = _render(capsys, "--print", "slurm", *flags, *slurm)
    _bash_ok(text)
    directives = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]
    for want in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4", "--partition=gpu", "--time=1-00:00:00"):
        assert want in directives
    args = _run_stubbed(text, {"SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_ID": "4242"})
    parsed, config = _train_config(parse, args)
    assert (parsed.rdzv_backend, parsed.rdzv_endpoint, parsed.rdzv_id) == ("c10d", "node-a:29500", "4242")
    assert (parsed.nnodes, parsed.nproc_per_node) == ("2", "4")
    assert config == _expected_config(parse, *flags)
    assert parse(train_cli, *parsed.training_script_args).out == "/shared/runs/a b"


def test_trainjob_manifest_loads_as_yaml_and_carries_the_run(parse, capsys):
    yaml = pytest.importorskip("yaml")  # PyYAML: transformers' own dependency
    flags = [*TRAIN_FLAGS, "--nproc-per-node", "8", "--nnodes", "2"]
    text = _render(capsys, "--print", "kubeflow", *flags, "--image", "ghcr.io/me/ampkit:1", "--namespace", "ml")
    manifest = yaml.safe_load(text)
    assert (manifest["apiVersion"], manifest["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert manifest["metadata"] == {"name": "ampkit-train", "namespace": "ml"}
    spec = manifest["spec"]
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 2 and trainer["image"] == "ghcr.io/me/ampkit:1"
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": 8}
    assert trainer["command"][0] == "torchrun"
    parsed, config = _train_config(parse, trainer["command"][1:])
    assert parsed.nproc_per_node == "8"
    assert config == _expected_config(parse, *flags)
    assert all(isinstance(word, str) for word in trainer["command"])  # "17" stays a string, not a number


def test_cpu_job_asks_for_no_gpus_and_json_record_matches_the_file(capsys, tmp_path):
    out = tmp_path / "job.sbatch"
    flags = ["--print", "slurm", "--parallel", "ddp", "--device", "cpu", "--nproc-per-node", "2", "--out", str(out)]
    record = json.loads(_render(capsys, *flags, "--json"))
    assert record["gpus_per_node"] == 0 and "--gpus-per-node" not in out.read_text()
    assert record["text"] == out.read_text() and record["train_argv"] == ["--device", "cpu", "--parallel", "ddp"]
    assert main(["launch", *flags]) == 2  # never over an existing file
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--print", "k8s", "--parallel", "ddp", "--nproc", "2"], "unknown --print 'k8s'"),
        (["--print", "slurm", "--parallel", "ddp", "--nproc", "2", "--nnodes", "0"], "--nnodes must be >= 1"),
        (["--print", "slurm", "--nnodes", "2"], "add --parallel ddp or --parallel fsdp"),
        (["--print", "slurm", "--parallel", "ddp"], "add --nproc-per-node N"),
        (["--print", "slurm", "--parallel", "ddp", "--nproc", "2", "--time", "4h"], "--time '4h'"),
        (["--print", "kubeflow", "--parallel", "ddp", "--nproc", "2", "--job-name", "My_Job"], "--job-name"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, says):
    assert main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_config_file_becomes_flags_and_a_task_table_keeps_the_file(parse, capsys, tmp_path):
    plain = tmp_path / "plain.toml"
    plain.write_text('steps = 9\n[parallel]\nparallel = "ddp"\nnproc_per_node = 2\n', encoding="utf-8")
    record = json.loads(_render(capsys, "--print", "torchrun", "--config", str(plain), "--lr", "0.01", "--json"))
    assert record["train_argv"] == ["--steps", "9", "--lr", "0.01", "--parallel", "ddp"]  # no file needed
    tabled = tmp_path / "task.toml"
    tabled.write_text('[task]\nname = "mlp"\nwidth = 64\n', encoding="utf-8")
    flags = ["--config", str(tabled), "--parallel", "ddp", "--nproc", "2"]
    text = _render(capsys, "--print", "torchrun", *flags)
    _bash_ok(text)
    parsed, config = _train_config(parse, _run_stubbed(text, {}))
    assert parsed.training_script_args[1:3] == ["--config", str(tabled)]  # a table has no flag: the file carries it
    assert config.model.task_args == {"width": 64}
    want = resolve_config(TrainConfig, parse(launch_cli, "launch", "--print", "torchrun", *flags), toml_path=tabled)
    assert config == replace_settings(want, {"nproc_per_node": 0, "nnodes": 1})
