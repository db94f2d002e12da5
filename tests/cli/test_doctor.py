"""ampkit.cli.doctor: a fault spec naming no module is refused, and leaves no run directory behind; an
emulated precision is announced (bench's and train's warning) and gets shorter defaults; config.json."""

from __future__ import annotations

import json

import pytest

import ampkit.cli.doctor as doctor_cli
import ampkit.diagnostics.doctor as doctor_mod
from ampkit.diagnostics.config import NATIVE_DEFAULTS, DoctorConfig, doctor_defaults
from ampkit.errors import UsageError
from ampkit.precision import check_supported
from bench_fakes import AMX_CPU, AVX2_CPU


def test_a_bad_inject_path_removes_the_empty_run_directory(parse, tmp_path):
    out = tmp_path / "doctor"
    args = parse(doctor_cli, "doctor", "--inject", "blocks.9.mlp:forward:nan", "--out", str(out))
    with pytest.raises(UsageError, match="blocks.9"):
        doctor_cli.run(args)
    assert not out.exists()  # created before the model was built, removed again


def test_an_emulated_precision_is_announced_before_the_run_and_kept_short(parse, tmp_path, monkeypatch, capsys):
    """The synthetic AVX2-only CPU (fp16 emulated): the warning bench and train print comes first, then
    the shorter defaults it chose; the run directory has config.json like the others."""
    for module in (doctor_cli, doctor_mod):
        monkeypatch.setattr(module, "describe_device", lambda device: AVX2_CPU)
    out = tmp_path / "doctor"
    args = ["--steps", "1", "--no-smoke", "--no-fidelity", "--seq-len", "16", "--out", str(out)]  # kept quick
    assert doctor_cli.run(parse(doctor_cli, "doctor", *args)) == 0
    err = capsys.readouterr().err
    (emulated,) = check_supported("fp16-mixed", AVX2_CPU)  # the very warning bench and train print
    assert "fp16-mixed is emulated on this CPU" in emulated
    short = "doctor keeps it short here: --batch-size 2, --smoke-seq-len 8 (pass them to choose)"
    assert err.index(emulated[:60]) < err.index(short) < err.index("diagnostic run")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["warnings"] == [emulated, short]
    assert (summary["config"]["batch_size"], summary["config"]["smoke_seq_len"]) == (2, 8)
    assert json.loads((out / "config.json").read_text()) == summary["config"]


def test_defaults_follow_the_device_and_given_settings_stay():
    native, warnings = doctor_defaults(DoctorConfig(), AMX_CPU)
    assert warnings == [] and {key: getattr(native, key) for key in NATIVE_DEFAULTS} == NATIVE_DEFAULTS
    given, warnings = doctor_defaults(DoctorConfig(steps=3), AVX2_CPU)
    assert (given.steps, given.batch_size, given.smoke_seq_len) == (3, 2, 8)
    assert warnings[-1] == "doctor keeps it short here: --batch-size 2, --smoke-seq-len 8 (pass them to choose)"
    fp32, warnings = doctor_defaults(DoctorConfig(precision="fp32"), AVX2_CPU)  # fp32 is never emulated
    assert warnings == [] and fp32.steps == NATIVE_DEFAULTS["steps"]


def test_where_emulated_fp32s_smoke_test_runs_only_to_convict_a_failure(monkeypatch):
    monkeypatch.setattr(doctor_mod, "describe_device", lambda device: AVX2_CPU)
    result = doctor_mod.run_doctor(DoctorConfig.of(task="mlp", steps=1, fidelity=False))  # a quick smoke test
    assert list(result.smoke) == ["fp16-mixed"] and result.smoke["fp16-mixed"].passed


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--precision", "bf16-mixed", "--keep-fp32", "blocks.*.nope"],
        ["plan", "--model", "tiny", "--precisions", "bf16-true", "--keep-fp32", "blocks.*.nope"],
        ["bench", "--precisions", "bf16-mixed@blocks.*.nope", "--seq-len", "16", "--batch-size", "2"],
    ],
)
def test_a_module_pattern_matching_nothing_is_one_line_exit_2_in_every_command(argv, capsys, tmp_path):
    from ampkit.cli import main

    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "module pattern 'blocks.*.nope' matches no module" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()  # refused before any run directory
