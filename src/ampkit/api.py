"""The Python API of the main commands: the same run directory and summary as the command line.

    import ampkit.bench, ampkit.train, ampkit.doctor
    summary = ampkit.bench.run(task, budget_s=5)             # or a spec: "mlp", "my_tasks.py:make_task"
    summary = ampkit.train.run(task, steps=100, out="runs/mine")
    summary = ampkit.doctor.run(task, precision="fp16-mixed")
    summary = ampkit.doctor.run(from_run="runs/nan", try_fixes=True)  # a train run's window, each fix tried

`task` is a task object (`ampkit.tasks.Task`, e.g. a `SupervisedTask`), a task spec string, or None
for the language model the settings describe. Settings are the command's config fields by their flag
names (`batch_size=16`, `init_scale=4096.0`); `config=` names a TOML file they override; a mistake is a
`UsageError` with the same one-line message the command prints.

bench runs every precision in a fresh process, so a task *object* is pickled for them: define its
functions and classes at module level (a script's own, under `if __name__ == "__main__":`, work the
way multiprocessing's spawn does: the worker imports the script first).

Each command's function lives in its own package (`ampkit.bench.api`, `ampkit.train.api`,
`ampkit.train.doctor_api`: plain doctor is `ampkit.diagnostics.api`, `from_run=` needs train's resume),
below this module: the packages never import it back.
"""

from ampkit.bench.api import run as bench
from ampkit.train.api import run as train
from ampkit.train.doctor_api import run as doctor

__all__ = ["bench", "doctor", "train"]
