"""What `ampkit plan` prints and writes: `report.py`, the console tables and report.html/report.md of a
plan; `gpu_list.py`, `--gpu list` (the GPU table, every row with its source)."""
