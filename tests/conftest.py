"""Shared fixtures: tiny settings that keep the whole suite fast on a 2-core CPU."""

from __future__ import annotations

import os

# One OpenMP thread per process, set before torch is imported so that every command a test starts inherits
# it too (`python -m ampkit`, bench workers). The tests' tensors are small (tiny models), so a second
# thread buys little, while on a 2-core machine running two pytest-xdist workers two spinning OpenMP
# threads per process thrash: measured on a busy machine, tests/train/test_features.py's pack-vs-pad
# run took 3 s alone and 59 s beside one other 2-thread process.
os.environ["OMP_NUM_THREADS"] = "1"
# torch.compile's inductor compiles in this process, not in a thread pool whose idle workers outlive the
# test: a thread alive keeps plan/traced/forked.py from forking (it declines beside other threads), which
# skipped the forked-planner tests in any xdist worker that had run a compile test first.
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"

import io
import threading
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import tqdm
from _pytest.nodeid import NodeId

import ampkit.hardware.device as device_mod
import ampkit.report.console as console_mod
from ampkit.cli import main
from devices import CPU_KINDS, cpuinfo_file, pin_cpu_kind
from helpers import REAL_RUN_COLUMNS, REAL_RUN_DIR, REAL_RUNS, warm_ampkit

# tqdm (transformers' and peft's bars) starts a monitor thread at its first bar, which then lives to the
# end of the session; plan/traced/forked.py forks only from a thread-free process, so its tests would skip.
tqdm.tqdm.monitor_interval = 0


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-kind",
        choices=sorted(CPU_KINDS),
        default=None,
        help="run every test under this CPU kind's /proc/cpuinfo facts (bf16/fp16 native or emulated), whatever "
        "this machine is; the kernels keep this machine's speed (default: this machine's own facts)",
    )


def pytest_sessionstart(session):
    """A bench run in this process (`run_cli("bench", ...)`) starts its own warm process for its workers
    (`ampkit.bench.zygote`): here that one is forked from the tests' warm process (tests/warm_ampkit.py) instead
    of started cold, as in the commands the tests start. (A hook, not a session fixture: an autouse fixture
    wider than a test would tie every test into one xdist group, `pytest_collection_modifyitems` below.)"""
    from warm_ampkit import warm_bench_spawn

    config = session.config
    controller = config.getoption("numprocesses", None) and not hasattr(config, "workerinput")  # runs no test
    if config.getoption("collectonly") or controller:
        return
    path = warm_ampkit().started({k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    if path:
        warm_bench_spawn(path)


def pytest_configure(config):
    """`--cpu-kind KIND`: the whole session sees that kind's CPU, the fixtures wider than a test and the processes
    the tests start included (`$AMPKIT_CPUINFO`, which every xdist worker inherits); a test's own `cpu_kind` pin
    still wins."""
    kind = config.getoption("--cpu-kind")
    if kind is not None:
        os.environ[device_mod.CPUINFO_ENV] = str(cpuinfo_file(kind))


@pytest.fixture(params=sorted(CPU_KINDS))
def cpu_kind(request, monkeypatch) -> str:
    """Run the test once per CPU kind ("amx": bf16/fp16 native; "avx2": emulated), on either machine: every
    `describe_device`, in this process or one the test starts, sees that kind's facts. Returns the kind."""
    pin_cpu_kind(monkeypatch, request.param)
    return request.param


@pytest.fixture(autouse=True)
def _trace_cache_per_test(tmp_path_factory, monkeypatch):
    """Every test plans with its own empty trace cache (plan/traced/cache.py), never ~/.cache/ampkit:
    no test sees another's traces, and the commands it runs (in-process or not) inherit the folder."""
    monkeypatch.setenv("AMPKIT_CACHE_DIR", str(tmp_path_factory.mktemp("ampkit-cache")))


@pytest.fixture(autouse=True)
def _one_thread():
    """Deterministic thread count (bitwise-comparable results within one process and with the commands a
    test starts), restored after a test that sets its own."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture
def run_cli(capsys):
    """Run `ampkit ...` in-process; returns (exit code, stdout, stderr)."""

    def _run(*argv: str):
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


_TABLE_OF = console_mod.table_of


class RealRuns:
    """Each of `REAL_RUNS` run once, in-process, on first use, with `COLUMNS=80`: its run directory, its
    stdout and stderr, and every console table it built (each goes through `ampkit.report.console.table_of`).
    A `real-run:NAME` argument (`REAL_RUN_DIR`) is run NAME's directory, that run made first."""

    def __init__(self, root: Path):
        self.root = root
        self._done: dict[str, SimpleNamespace] = {}

    def __getitem__(self, name: str) -> SimpleNamespace:
        if name not in self._done:
            self._done[name] = self._run(name, REAL_RUNS[name])
        return self._done[name]

    def _run(self, name: str, argv: list[str]) -> SimpleNamespace:
        run_dir = self.root / name
        argv = [str(self[a.removeprefix(REAL_RUN_DIR)].run_dir) if a.startswith(REAL_RUN_DIR) else a for a in argv]
        tables: list = []

        def recording(*args, **kwargs):
            table = _TABLE_OF(*args, **kwargs)  # the real one, even inside a test that records its own
            tables.append(table)
            return table

        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, redirect_stdout(out), redirect_stderr(err):
            mp.setenv("COLUMNS", str(REAL_RUN_COLUMNS))
            mp.setattr(console_mod, "table_of", recording)
            code = main([*argv, "--out", str(run_dir)])
        assert code == 0, f"{name}: {err.getvalue()}"
        return SimpleNamespace(run_dir=run_dir, out=out.getvalue(), err=err.getvalue(), tables=tables, argv=argv)


def _shared_fixtures(item) -> list[tuple[str, str]]:
    """The module-, class-, package- and session-scoped fixtures of the suite's own that `item` uses, each
    as (name, the one place its value lives: its module, class or defining folder)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    shared = []
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        fixturedef = defs[-1]
        if fixturedef.scope == "function" or not fixturedef.baseid:  # per test, or a plugin's own
            continue
        if fixturedef.scope == "module":
            where = item.module.__name__ if item.module is not None else item.nodeid
        elif fixturedef.scope == "class":
            where = item.cls.__qualname__ if item.cls is not None else item.nodeid
        else:
            where = fixturedef.baseid
        shared.append((name, where))
    return shared


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), the tests that share a fixture wider
    than one test (module or session scope: a real run, a launched job, a built folder) go to one worker
    together, so each such value is still made once per session, not once per worker that gets one of
    its tests (tests that share two such fixtures tie their groups together). The group of the shared
    real runs (`REAL_RUNS`) is named `real_runs`."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    uses = {}
    for item in items:
        keys = _shared_fixtures(item)
        uses[item] = keys
        for key in keys[1:]:
            parent[root(key)] = root(keys[0])
    members: dict[tuple[str, str], set] = {}
    for keys in uses.values():
        for key in keys:
            members.setdefault(root(key), set()).add(key)
    names = {
        top: "real_runs" if any(name == "real_runs" for name, _ in keys) else "{}:{}".format(*min(keys))
        for top, keys in members.items()
    }
    for item, keys in uses.items():
        if keys:
            group = names[root(keys[0])]
            item.add_marker(pytest.mark.xdist_group(group))
            if config.getoption("loadgroup", False) and isinstance(getattr(item, "_id", None), NodeId):
                # pytest-xdist 3.8 tells its scheduler the group by renaming the test `<nodeid>@<group>`
                # through `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`): without
                # this every test was scheduled alone and each shared run made once per worker
                item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory) -> RealRuns:
    """The shared real runs of `REAL_RUNS` (read them, never change them)."""
    return RealRuns(tmp_path_factory.mktemp("real-runs"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped because this process runs another Python thread (plan/traced/forked.py forks only
    from a thread-free process) names the threads alive in its skip reason (`make test` lists skips with
    -rs), so the test that left one behind can be found."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and "forking is not offered" in report.longrepr[2]:
        alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        if alive:
            path, line, reason = report.longrepr
            report.longrepr = (path, line, f"{reason}; threads alive: {', '.join(alive)}")
    return report


def pytest_terminal_summary(terminalreporter):
    """The folders of files a test left for a person to look at (`record_property("screenshots", FOLDER)`:
    tests/report/test_browser.py's screenshots of real reports in Chromium), one line each at the end of the
    output; under pytest-xdist the workers' reports carry their properties to this, the controller's, summary."""
    folders = {
        str(value)
        for reports in terminalreporter.stats.values()
        for report in reports
        for key, value in getattr(report, "user_properties", ())
        if key == "screenshots"
    }
    for folder in sorted(folders):
        terminalreporter.write_line(f"screenshots of the reports in Chromium: {folder}")
