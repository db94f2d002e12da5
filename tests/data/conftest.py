"""The instruction-data fixtures (tests/instruction_fixtures.py) for every test here."""

from instruction_fixtures import bpe_model_dir, chat_file, prompt_completion_file  # noqa: F401  (fixtures)
