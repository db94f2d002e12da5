"""Planning vision-language models (image-text, `hf:` VLM configs): what `ampkit plan` and `ampkit kv`
do for them.

- `plan/describe/vlm.py` (with the other descriptions): `VLMDescription`, the model counted on the
  meta device per part (vision, projector with fusion layers, language) and its stacks;
- `workload.py`: what one sample holds (images, their tokens by the family's rule, text tokens) and
  which parts train;
- `ledger.py`: the step's memory ledger, per part (parameters, gradients and optimizer states of the
  trained parts, each part in its own precision; activations by stack);
- `compute.py`: FLOPs of a step (vision encoder passes, projector, language model over text + image
  tokens, mllama's cross-attention) and its time;
- `engine.py`: the ledger behind the planner's engine interface (ledger, fit, largest);
- `planner.py`: the plan (`ampkit.plan/1` rows, with the parts) and the KV budget with mllama's
  cross-attention cache.
"""
