"""`ampkit.doctor.run(task, **settings)`: the Python API of `ampkit doctor` (see `ampkit.api`)."""

from ampkit.diagnostics.api import run

__all__ = ["run"]
