"""torchao, an optional dependency, imported lazily and quietly (`pip install 'ampkit[fp8]'`)."""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from ampkit.errors import UsageError

_QUIET_AT_IMPORT = ("torchao", "torch.utils._pytree")


def load_torchao(module: str, *, what: str) -> ModuleType:
    """`torchao.<module>`; its absence is one line naming the extra to install (`what`: "fp8", "mxfp8").

    torchao logs a warning per optional CUDA extension it cannot load at import (and torch's pytree one
    per enum torchao registers); on a CPU build that is noise. The loggers are quiet for the import only,
    then restored to their levels."""
    loggers = [logging.getLogger(name) for name in _QUIET_AT_IMPORT]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        return importlib.import_module(f"torchao.{module}")
    except ImportError:
        raise UsageError(f"{what} needs torchao, which is not installed: pip install 'ampkit[fp8]'") from None
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
