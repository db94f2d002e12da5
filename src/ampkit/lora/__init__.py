"""LoRA and QLoRA fine-tuning through peft (`pip install 'ampkit[lora]'`).

- `settings.py`: the `[lora]` section (`--lora RANK`, `--lora-alpha`, `--lora-dropout`, `--lora-targets`,
  `--base-dtype`) and its config-time checks;
- `targets.py`: `--lora-targets` patterns and the per-family defaults;
- `apply.py`: adapters injected in place (peft), fp32 and seeded; the trainable count;
- `nf4.py`: the 4-bit base (bitsandbytes) and the check that it runs on the device;
- `state.py`: the checkpoint's adapter state and the base's identity and checksum;
- `build.py`: the base built in its storage dtype, then adapted (`train`, `bench` and `doctor` call it).
Exports and the planner's ledger live with their commands (`ampkit.train.export`, `ampkit.plan.lora.ledger`).
"""

from ampkit.lora.settings import BASE_DTYPES, LoraSettings, check_lora_run, lora_field

__all__ = ["BASE_DTYPES", "LoraSettings", "check_lora_run", "lora_field"]
