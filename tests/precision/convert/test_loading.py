"""ampkit.precision.convert.loading: torchao's modules load lazily; a missing one is one line with the extra."""

from __future__ import annotations

import logging

import pytest

from ampkit.errors import UsageError
from ampkit.precision.convert.loading import load_torchao

pytest.importorskip("torchao")


def test_a_module_torchao_lacks_is_one_line_naming_the_extra():
    with pytest.raises(UsageError, match=r"^mxfp9 needs torchao, which is not installed: pip install 'ampkit\[fp8\]'$"):
        load_torchao("no_such_module_here", what="mxfp9")


def test_loading_leaves_the_loggers_at_their_levels():
    logger = logging.getLogger("torchao")
    before = logger.level
    assert load_torchao("float8", what="fp8").__name__ == "torchao.float8"
    assert logger.level == before
