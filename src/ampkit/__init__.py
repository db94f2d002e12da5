"""ampkit: choose, prove and run the right numeric precision for PyTorch training."""

__version__ = "0.1.0"
