"""Shared test constants (importable because pytest's `pythonpath` includes tests/)."""

# A training run small enough for tests: tiny preset, short rows, few steps.
TINY_ARGS = ["--model", "tiny", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "2", "--eval-batches", "2"]
