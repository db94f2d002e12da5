"""`ampkit plan --lora`: the LoRA (and QLoRA) step's memory.

- `ledger.py`: the analytic LoRA ledger and its search (`LoraPlan`, `analytic_lora_ledger`);
- `replay.py`: the LoRA step script on the analytic engine's `Replay`;
- `trace.py`: the LoRA step traced and measured; `plan.py`: `plan --lora`'s rows (full vs LoRA vs
  QLoRA), summary and report.
"""
