"""Workloads behind one contract (`ampkit.tasks.base.Task`): the built-in language model, Hugging Face
models, the built-in mlp/convnet/encoder tasks and the user's own (`--task file.py:factory`)."""

from ampkit.tasks.base import BatchStream, IndexStream, SupervisedTask, Task, TensorBatch, fixed_batches

__all__ = ["BatchStream", "IndexStream", "SupervisedTask", "Task", "TensorBatch", "fixed_batches"]
