"""`Record`: the base of the result dataclasses whose JSON form is their fields as they are."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Record:
    """Mixed into a dataclass: `to_dict()` is `dataclasses.asdict` (nested dataclasses become dicts too).
    A record whose summary form adds or renames fields writes its own `to_dict`."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(cast("DataclassInstance", self))
