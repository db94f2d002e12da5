"""Config sections (`ampkit.config`): a section's settings are flags of their own names, a [table] in
TOML, a nested dict in config.json and `--print-config`; files written before the sections existed
(their settings at top level) still load."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from ampkit.config import (
    add_config_flags,
    config_to_dict,
    config_to_toml,
    flat_settings,
    resolve_config,
)
from ampkit.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class Knobs:
    scale: float = field(default=8.0, metadata={"help": "a scale"})
    every: int = field(default=5, metadata={"help": "an interval"})

    def __post_init__(self):
        if self.scale <= 0:
            raise UsageError(f"--scale must be positive, got {self.scale}")


@dataclass(frozen=True, kw_only=True)
class Toy:
    steps: int = field(default=3, metadata={"help": "steps"})
    knobs: Knobs = field(default_factory=lambda: Knobs(every=7), metadata={"help": "the knobs"})
    name: str = field(default="x", metadata={"help": "a name"})


@dataclass(frozen=True, kw_only=True)
class ClashWithTop:
    scale: float = 1.0
    knobs: Knobs = field(default_factory=Knobs)


@dataclass(frozen=True, kw_only=True)
class OtherKnobs:
    every: int = 2


@dataclass(frozen=True, kw_only=True)
class ClashBetweenSections:
    knobs: Knobs = field(default_factory=Knobs)
    more: OtherKnobs = field(default_factory=OtherKnobs)


@dataclass(frozen=True, kw_only=True)
class Nested:
    inner: Toy = field(default_factory=Toy)


def _parse(cls, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, cls)
    return parser.parse_args(list(argv))


def _toml(tmp_path, text: str, name: str = "c.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- the mechanism, on a toy config


def test_section_settings_are_flags_of_their_own_names():
    config = resolve_config(Toy, _parse(Toy, "--scale", "2", "--steps", "4"))
    assert config.steps == 4 and config.knobs == Knobs(scale=2.0, every=7)  # the class's section default kept
    assert resolve_config(Toy, _parse(Toy)) == Toy()
    with pytest.raises(SystemExit):
        _parse(Toy, "--knobs", "1")  # a section is not a flag
    with pytest.raises(SystemExit):
        _parse(Toy, "--knobs-scale", "1")  # no prefix


def test_toml_table_layers_under_flags(tmp_path):
    path = _toml(tmp_path, 'steps = 9\nname = "y"\n\n[knobs]\nscale = 3\n')
    config = resolve_config(Toy, _parse(Toy, "--every", "11"), toml_path=path)
    assert config == Toy(steps=9, name="y", knobs=Knobs(scale=3.0, every=11))
    assert config_to_dict(config) == {"steps": 9, "knobs": {"scale": 3.0, "every": 11}, "name": "y"}


def test_print_config_writes_the_section_as_a_table_that_loads_back(tmp_path):
    config = Toy(steps=2, knobs=Knobs(scale=0.5, every=1))
    text = config_to_toml(config)
    assert text.endswith('name = "x"\n\n[knobs]\nscale = 0.5\nevery = 1\n')
    assert resolve_config(Toy, toml_path=_toml(tmp_path, text)) == config


def test_a_section_setting_at_top_level_is_mapped_into_its_section(tmp_path):
    assert resolve_config(Toy, toml_path=_toml(tmp_path, "scale = 2\nevery = 3\n")).knobs == Knobs(scale=2.0, every=3)
    assert resolve_config(Toy, base={"scale": 4.0}).knobs == Knobs(scale=4.0, every=7)
    assert flat_settings(Toy, {"steps": 1, "knobs": {"every": 2}, "scale": 1}) == {"steps": 1, "every": 2, "scale": 1.0}


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("[knobs]\nfoo = 1\n", ["unknown setting 'foo' in [knobs] of ", "c.toml", "known settings: scale, every"]),
        ("[knobs]\nsteps = 1\n", ["unknown setting 'steps' in [knobs] of "]),
        ("foo = 1\n", ["unknown setting 'foo' in ", "steps, name; [knobs] scale, every"]),
        ('[knobs]\nevery = "x"\n', ["setting 'every' in [knobs] of ", "must be int, got 'x'"]),
        ("[knobs]\nevery = true\n", ["setting 'every' in [knobs] of ", "must be int"]),
        ("every = 1.5\n", ["setting 'every' in ", "c.toml must be int"]),
        ("knobs = 3\n", ["setting 'knobs' in ", "must be a [knobs] table"]),
        ("scale = 2.0\n[knobs]\nscale = 3.0\n", ["'scale' is given twice", "keep the one in [knobs]"]),
        ("[knobs]\nscale = -1.0\n", ["--scale must be positive"]),
    ],
)
def test_bad_section_entries_are_one_line_usage_errors(tmp_path, text, needles):
    with pytest.raises(UsageError) as err:
        resolve_config(Toy, toml_path=_toml(tmp_path, text))
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    ("cls", "needle"),
    [
        (ClashWithTop, "setting 'scale' of section [knobs] clashes with 'scale' of the top level"),
        (ClashBetweenSections, "setting 'every' of section [more] clashes with 'every' of [knobs]"),
        (Nested, "holds section 'knobs'"),
    ],
)
def test_a_name_clash_is_refused_when_the_class_is_registered(cls, needle):
    with pytest.raises(TypeError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        add_config_flags(argparse.ArgumentParser(), cls)
    with pytest.raises(TypeError):
        resolve_config(cls)
