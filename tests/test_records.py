"""`Record.to_dict` is `dataclasses.asdict`, nested records included."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ampkit.diagnostics.scale import ScaleEvent
from ampkit.plan.setting import StepSetting
from ampkit.records import Record


@dataclass(frozen=True)
class _Inner(Record):
    x: int


@dataclass(frozen=True)
class _Outer(Record):
    name: str
    inner: _Inner
    items: list[_Inner]


def test_to_dict_is_asdict_with_nested_records_as_dicts():
    outer = _Outer("a", _Inner(1), [_Inner(2), _Inner(3)])
    assert outer.to_dict() == asdict(outer) == {"name": "a", "inner": {"x": 1}, "items": [{"x": 2}, {"x": 3}]}


def test_result_records_serialise_their_fields():
    event = ScaleEvent(step=3, kind="backoff", before=65536.0, after=32768.0)
    assert event.to_dict() == {"step": 3, "kind": "backoff", "before": 65536.0, "after": 32768.0}
    setting = StepSetting(precision="bf16-mixed", optimizer="adamw", checkpointing="none", micro_batch=2, seq_len=64)
    assert setting.to_dict() == asdict(setting) and setting.to_dict()["micro_batch"] == 2
