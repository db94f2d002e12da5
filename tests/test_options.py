"""Options shared by several commands: one help text each, notes appended, choices listed once."""

from __future__ import annotations

import dataclasses

from ampkit.bench.config import BenchConfig
from ampkit.config import config_layout
from ampkit.diagnostics.config import DoctorConfig
from ampkit.options import OPTIMIZERS, choices_text, lr_field, task_field
from ampkit.train.config import TrainConfig


def _help(cls, name: str) -> str:
    return next(f.metadata["help"] for f in dataclasses.fields(cls) if f.name == name)


def _setting_help(cls, name: str) -> str:
    """A setting's help, a section's included (with the command's note)."""
    return config_layout(cls).settings[name].help


def test_a_shared_option_reads_the_same_in_every_command():
    for name in ("task", "model", "seed", "device"):  # bench's seed adds a note: the shared text comes first
        texts = [_setting_help(cls, name) for cls in (TrainConfig, BenchConfig, DoctorConfig)]
        assert all(text.startswith(texts[0]) for text in texts), (name, texts)


def test_a_note_is_appended_inside_the_parentheses_or_after_the_text():
    @dataclasses.dataclass
    class Example:
        lr: float = lr_field(1e-3, note="of the diagnostic run")
        task: str = task_field(note="doctor only")

    assert _help(Example, "lr").endswith("(of the diagnostic run)")
    assert _help(Example, "task").endswith("; doctor only)")  # the text ends in parentheses already


def test_choices_read_as_a_sentence():
    assert (
        choices_text(OPTIMIZERS) == "adamw, adamw-8bit, adamw-sr, adamw-kahan or sgd"
        and choices_text(["only"]) == "only"
    )


def test_the_preset_names_in_the_help_are_the_presets():
    from ampkit.models.presets import PRESETS
    from ampkit.options import PRESET_NAMES

    assert ", ".join(PRESETS) == PRESET_NAMES
