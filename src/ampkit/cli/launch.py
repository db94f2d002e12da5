"""`ampkit launch --print torchrun|slurm|kubeflow`: the same train run, as a cluster starts it.

It takes `ampkit train`'s settings (its flags and `--config FILE.toml`, resolved and checked as
train resolves them) and writes one of:
- `torchrun`: the command line for each node (`--standalone` on one node; on several, c10d
  rendezvous at `$MASTER_ADDR:$MASTER_PORT`, the same on every node);
- `slurm`: an sbatch script: one task per node (`srun --ntasks-per-node=1`), each running torchrun
  with c10d rendezvous on the first node of `$SLURM_JOB_NODELIST` (`scontrol show hostnames`),
  `--rdzv-id $SLURM_JOB_ID`;
- `kubeflow`: a Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1) on the
  `torch-distributed` ClusterTrainingRuntime: `numNodes`, `resourcesPerNode`, and a `torchrun`
  command (the runtime sets torchrun's node count, node rank and master through its `PET_*`
  environment; `--nproc-per-node` is given explicitly).
The train flags are every setting that differs from train's default, except the process counts,
which torchrun carries. Each argument is shell-quoted (`shlex.quote`); only the rendezvous
variables are left for the shell to expand. Printed to stdout, or written to `--out FILE` (never
over an existing file); `--json` prints the `LaunchPlan` record instead.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ampkit.cli import add_command
from ampkit.config import add_config_flags, config_layout, config_to_dict, flat_settings, resolve_config
from ampkit.errors import UsageError
from ampkit.records import Record
from ampkit.runs import write_text_atomic
from ampkit.train.config import TrainConfig

TARGETS = ("torchrun", "slurm", "kubeflow")
CARRIED_BY_TORCHRUN = ("nproc_per_node", "nnodes")  # torchrun's own flags; the ranks read WORLD_SIZE
KUBEFLOW_API = "trainer.kubeflow.org/v1alpha1"
KUBEFLOW_RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime Kubeflow Trainer installs for PyTorch
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:@+=-]+$")  # #SBATCH lines are read by sbatch, not a shell: no quoting
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{2}(:\d{2})?|\d+-\d{1,2}(:\d{2}(:\d{2})?)?)$")  # sbatch's --time forms
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a DNS-1123 label: TrainJob names and namespaces


@dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """Where the job runs: the scheduler's settings (train's own settings are `TrainConfig`'s)."""

    gpus_per_node: int | None = field(
        default=None,
        metadata={"help": "GPUs each node asks for (slurm, kubeflow); default --nproc-per-node, 0 with --device cpu"},
    )
    partition: str | None = field(default=None, metadata={"help": "slurm: the partition (#SBATCH --partition)"})
    account: str | None = field(default=None, metadata={"help": "slurm: the account charged (#SBATCH --account)"})
    time: str | None = field(
        default=None, metadata={"help": "slurm: the time limit, e.g. 90, 4:00:00 or 2-00:00:00 (#SBATCH --time)"}
    )
    job_name: str = field(
        default="ampkit-train", metadata={"help": "slurm's job name; kubeflow's TrainJob name (lowercase, digits, -)"}
    )
    image: str | None = field(
        default=None, metadata={"help": "kubeflow: the trainer's container image, with ampkit installed"}
    )
    namespace: str | None = field(default=None, metadata={"help": "kubeflow: the TrainJob's namespace"})
    master_port: int = field(default=29500, metadata={"help": "torchrun, slurm: the c10d rendezvous port"})
    run_dir: str | None = field(
        default=None,
        metadata={"help": "train's --out on the cluster: a folder every node sees (default runs/<time>-train)"},
    )

    def __post_init__(self) -> None:
        if self.gpus_per_node is not None and self.gpus_per_node < 0:
            raise UsageError(f"--gpus-per-node must be >= 0, got {self.gpus_per_node}")
        if not 1 <= self.master_port <= 65535:
            raise UsageError(f"--master-port must be a TCP port, 1 to 65535, got {self.master_port}")
        for flag, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not _SLURM_WORD.match(value):
                raise UsageError(f"{flag} {value!r}: letters, digits and _.,:@+=- only (sbatch reads it unquoted)")
        if self.time is not None and not _SLURM_TIME.match(self.time):
            raise UsageError(f"--time {self.time!r}: use minutes, H:MM:SS, D-HH or D-HH:MM:SS (sbatch's forms)")
        for flag, value in (("--job-name", self.job_name), ("--namespace", self.namespace)):
            if value is not None and (len(value) > 63 or not _K8S_NAME.match(value)):
                raise UsageError(f"{flag} {value!r}: lowercase letters, digits and '-', at most 63 (a Kubernetes name)")


@dataclass(frozen=True)
class LaunchPlan(Record):
    """What `ampkit launch` writes: `text` (the command line, sbatch script or manifest) and its parts."""

    target: str
    """torchrun, slurm or kubeflow"""
    nnodes: int
    nproc_per_node: int
    gpus_per_node: int
    torchrun_argv: list[str]
    """torchrun's arguments (before `-m ampkit train`); `$NAME` parts are expanded by the shell"""
    train_argv: list[str]
    """`ampkit train`'s arguments: the run's settings that differ from train's defaults"""
    text: str


def register(subparsers) -> argparse.ArgumentParser:
    parser = add_command(
        subparsers,
        "launch",
        "Print how a cluster starts this train run: a torchrun command line, an sbatch script, or a Kubeflow "
        "Trainer TrainJob manifest. Takes train's flags and --config; docs/distributed.md.",
    )
    parser.add_argument(
        "--print", dest="target", metavar="TARGET", required=True, help=f"what to write: {', '.join(TARGETS)}"
    )
    add_config_flags(parser, TrainConfig)
    add_config_flags(parser, LaunchSettings)  # where the job runs: the scheduler's settings
    parser.add_argument("--config", metavar="FILE.toml", help="train's settings file; flags given here override it")
    parser.add_argument("--out", metavar="FILE", help="write it to FILE (never overwritten) instead of stdout")
    parser.add_argument("--json", action="store_true", help="print the LaunchPlan record (JSON) to stdout")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.target not in TARGETS:
        raise UsageError(f"unknown --print {args.target!r}; choose one of: {', '.join(TARGETS)}")
    config = resolve_config(TrainConfig, args, toml_path=args.config)
    settings = resolve_config(LaunchSettings, args)
    plan = build_plan(args.target, config, settings, config_file=args.config)
    if args.out:
        out = Path(args.out)
        if out.exists():
            raise UsageError(f"{out} already exists; launch never overwrites: pass --out NEW_FILE or remove it")
        write_text_atomic(out, plan.text)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    elif not args.out:
        print(plan.text, end="")
    return 0


def train_argv(config: TrainConfig, *, run_dir: str | None = None, config_file: str | None = None) -> list[str]:
    """`ampkit train`'s arguments for `config`: each setting that differs from train's default, as its
    flag (a switch as --x / --no-x), except torchrun's process counts. A table setting (`task_args`)
    has no flag: its `--config` file is passed on (the path as given; the cluster must see it)."""
    layout = config_layout(TrainConfig)
    now = flat_settings(TrainConfig, config_to_dict(config))
    default = flat_settings(TrainConfig, config_to_dict(TrainConfig()))
    argv: list[str] = []
    for name, value in now.items():
        if name in CARRIED_BY_TORCHRUN or value == default.get(name) or value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if layout.settings[name].type is dict:  # only a --config file sets one: it is passed on below
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    if config_file is not None and any(layout.settings[k].type is dict and v for k, v in now.items()):
        argv = ["--config", config_file, *argv]
    return [*argv, "--out", run_dir] if run_dir else argv


def build_plan(target: str, config: TrainConfig, settings: LaunchSettings, *, config_file: str | None) -> LaunchPlan:
    """The `LaunchPlan` for `target`; refuses a run that is not data-parallel or has no process count."""
    parallel = config.parallel
    if parallel.parallel == "none":
        raise UsageError("launch starts a data-parallel job: add --parallel ddp or --parallel fsdp")
    gpus = settings.gpus_per_node
    nproc = parallel.nproc_per_node or gpus or 0
    if nproc < 1:
        raise UsageError("launch needs the processes per node: add --nproc-per-node N (one per GPU)")
    if gpus is None:
        gpus = 0 if config.device == "cpu" else nproc
    argv = train_argv(config, run_dir=settings.run_dir, config_file=config_file)
    nnodes = parallel.nnodes
    render = {"torchrun": _torchrun_text, "slurm": _sbatch_text, "kubeflow": _trainjob_text}[target]
    torchrun, text = render(nnodes=nnodes, nproc=nproc, gpus=gpus, train=argv, settings=settings)
    return LaunchPlan(
        target=target,
        nnodes=nnodes,
        nproc_per_node=nproc,
        gpus_per_node=gpus,
        torchrun_argv=torchrun,
        train_argv=argv,
        text=text,
    )


def _shell_line(words: list[str], *, raw: frozenset[str] = frozenset()) -> str:
    """`words` as one shell command, each quoted (`shlex.quote`) but those in `raw`, which hold `$VAR`
    references for the shell to expand (double-quoted), continued over lines of about 80 columns."""
    parts = [f'"{w}"' if w in raw else shlex.quote(w) for w in words]
    lines, line = [], ""
    for part in parts:  # a break before a flag only: a flag and its value stay on one line
        joined = f"{line} {part}" if line else part
        if line and len(joined) > 76 and part.startswith("-"):
            lines.append(line)
            line = "    " + part
        else:
            line = joined
    lines.append(line)
    return " \\\n".join(lines) + "\n"


def _rdzv(endpoint: str, rdzv_id: str) -> list[str]:
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]


def _torchrun_text(*, nnodes: int, nproc: int, gpus: int, train: list[str], settings: LaunchSettings):
    """Run on each node (one node: `--standalone`, torchrun's own local rendezvous)."""
    del gpus
    counts = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc)]
    if nnodes == 1:
        torchrun = ["--standalone", *counts]
        raw: frozenset[str] = frozenset()
    else:
        endpoint = f"${{MASTER_ADDR:?set MASTER_ADDR to the first node}}:${{MASTER_PORT:-{settings.master_port}}}"
        rdzv_id = f"${{RDZV_ID:-{settings.job_name}}}"
        torchrun = [*counts, *_rdzv(endpoint, rdzv_id)]
        raw = frozenset({endpoint, rdzv_id})
    head = "# the same line on every node; MASTER_ADDR: the first node's address\n" if nnodes > 1 else ""
    return torchrun, head + _shell_line(["torchrun", *torchrun, "-m", "ampkit", "train", *train], raw=raw)


def _sbatch_text(*, nnodes: int, nproc: int, gpus: int, train: list[str], settings: LaunchSettings):
    """An sbatch script: one srun task per node, each a torchrun agent meeting at the first node."""
    directives = [f"--job-name={settings.job_name}", f"--nodes={nnodes}", "--ntasks-per-node=1"]
    directives += [f"--gpus-per-node={gpus}"] if gpus else []
    directives += [f"--partition={settings.partition}"] if settings.partition else []
    directives += [f"--account={settings.account}"] if settings.account else []
    directives += [f"--time={settings.time}"] if settings.time else []
    directives += ["--output=%x-%j.out"]  # job name - job id
    endpoint, rdzv_id = "$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID"
    torchrun = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc), *_rdzv(endpoint, rdzv_id)]
    command = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "torchrun", *torchrun, "-m", "ampkit", "train"]
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "# written by ampkit launch --print slurm; submit with: sbatch FILE",
        "set -eu",
        "# the rendezvous host: the job's first node (every node's torchrun agent meets there)",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT=${{MASTER_PORT:-{settings.master_port}}}",
        "export MASTER_ADDR MASTER_PORT",
        "",
    ]
    return torchrun, "\n".join(lines) + _shell_line([*command, *train], raw=frozenset({endpoint, rdzv_id}))


def _trainjob_text(*, nnodes: int, nproc: int, gpus: int, train: list[str], settings: LaunchSettings):
    """A Kubeflow Trainer TrainJob; the runtime's torch policy sets torchrun's PET_NNODES, PET_NODE_RANK,
    PET_MASTER_ADDR and PET_MASTER_PORT on each node, so only --nproc-per-node is given here."""
    metadata: dict = {"name": settings.job_name}
    if settings.namespace:
        metadata["namespace"] = settings.namespace
    torchrun = ["--nproc-per-node", str(nproc)]
    trainer: dict = {"numNodes": nnodes, "command": ["torchrun", *torchrun, "-m", "ampkit", "train", *train]}
    if settings.image:
        trainer = {"image": settings.image, **trainer}
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    manifest = {
        "apiVersion": KUBEFLOW_API,
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {
            "runtimeRef": {
                "name": KUBEFLOW_RUNTIME,
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "trainer": trainer,
        },
    }
    head = "# written by ampkit launch --print kubeflow; submit with: kubectl apply -f FILE\n"
    return torchrun, head + "\n".join(yaml_lines(manifest)) + "\n"


def yaml_lines(value, indent: int = 0) -> list[str]:
    """`value` (dicts, lists, str, int) as block YAML; every string double-quoted as JSON writes it (a
    JSON string is a valid YAML double-quoted scalar), so no value is read as a number, bool or null."""
    pad = " " * indent
    lines: list[str] = []
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    for key, item in items:
        lead = f"{pad}{_yaml_key(key)}:" if key is not None else f"{pad}-"
        if isinstance(item, (dict, list)) and item:
            lines.append(lead)
            lines += yaml_lines(item, indent + 2)
        else:
            lines.append(f"{lead} {json.dumps(item)}")
    return lines


def _yaml_key(key: str) -> str:
    return key if re.match(r"^[A-Za-z][A-Za-z0-9_./-]*$", key) else json.dumps(key)
