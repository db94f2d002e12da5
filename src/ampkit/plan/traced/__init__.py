"""The traced engine: one real `Trainer.train_step` on fake tensors, every storage counted.

- `trace.py`: ampkit's own model traced (`traced_ledger`); `tracker.py`: `StorageTracker`, the dispatch
  mode that sorts storages into the ledger's lines per moment;
- `hf.py`: a transformers model's step at any depth; `extrapolate.py`: shallow traces extrapolated
  to the depth (checked; a full trace otherwise); `forked.py`: part of them in a forked child;
- `measure.py`: a real CPU step's peak, to check the tracer.

Imported on demand: it loads fake-tensor machinery.
"""
