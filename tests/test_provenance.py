"""ampkit.provenance: the block a summary records so that its report can be rendered again anywhere."""

from __future__ import annotations

import json

from ampkit import __version__
from ampkit.hardware.device import DeviceInfo
from ampkit.provenance import command_line, device_text, handed_to_ranks, invoked_as, provenance


def _info(**overrides) -> DeviceInfo:
    facts = dict(
        type="cuda",
        name="NVIDIA H200",
        compute_capability=(9, 0),
        native_bf16=True,
        native_fp16=True,
        has_tf32=True,
        has_fp8=True,
        cpu_flags=frozenset(),
        total_memory_bytes=140 * 1024**3,
        gpu_model="H200",
        index=0,
    )
    return DeviceInfo(**(facts | overrides))


def test_the_command_line_is_the_one_main_was_given_quoted_for_a_shell():
    assert command_line() is None  # the Python API: no command line
    with invoked_as(["train", "--data", "my file.txt", "--steps", "5"]):
        assert command_line() == "ampkit train --data 'my file.txt' --steps 5"
    assert command_line() is None


def test_a_device_is_one_line_with_its_memory_in_gib():
    text = device_text(_info())
    assert text.startswith("NVIDIA H200 [H200] (cuda:0, ") and text.endswith(", 140.0 GiB)")
    cpu = _info(type="cpu", name="Xeon", compute_capability=None, gpu_model=None, index=None, total_memory_bytes=2**33)
    assert device_text(cpu) == "Xeon (cpu, 8.0 GiB)"


def test_the_block_holds_date_versions_device_command_and_config_as_json():
    with invoked_as(["plan", "--model", "tiny"]):
        block = provenance(device="none", config={"model": "tiny", "lora": {"lora": 0}})
    assert set(block) == {"created_utc", "ampkit_version", "torch_version", "device", "command_line", "config"}
    assert block["ampkit_version"] == __version__ and block["torch_version"]
    assert block["command_line"] == "ampkit plan --model tiny" and block["created_utc"].endswith("Z")
    assert json.loads(json.dumps(block)) == block


def test_ranks_launched_by_nproc_record_the_launchers_command_line(monkeypatch):
    monkeypatch.delenv("AMPKIT_LAUNCHER_COMMAND_LINE", raising=False)
    with invoked_as(["train", "--nproc", "2"]), handed_to_ranks():  # noqa: SIM117 (the launcher, then a rank in it)
        with invoked_as(["train", "--out", "runs/x"]):  # a rank: torchrun's worker argv
            assert command_line() == "ampkit train --nproc 2"
    assert command_line() is None  # the launcher's environment is restored
