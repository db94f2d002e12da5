"""`ampkit.doctor.run(task, **settings)`: the Python API of `ampkit doctor`, `from_run=` included (see `ampkit.api`)."""

from ampkit.train.doctor_api import run

__all__ = ["run"]
