"""`ampkit.doctor.run(task, **settings)`: the Python API of `ampkit doctor` (see `ampkit.api`)."""

from ampkit.api import doctor as run

__all__ = ["run"]
