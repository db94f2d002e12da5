"""KV-cache budgets (`ampkit kv`).

- `budget.py`: KV bytes per token and the tokens a memory pool holds, per KV dtype;
- `measured.py`: `kv --from-bench`, the budget from what `bench --inference` measured (and the rows of
  a serving configuration both print).
"""
