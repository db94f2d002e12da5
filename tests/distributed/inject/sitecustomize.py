"""Test-only fault injection, imported by every Python process whose PYTHONPATH holds this folder.

In the torchrun worker whose RANK equals AMPKIT_TEST_DIE_RANK, `torch.distributed.checkpoint.save`
is wrapped: once it has written this rank's shards of the checkpoint for step AMPKIT_TEST_DIE_STEP,
the process exits at once (code 7), as a crashed or preempted rank would: mid-checkpoint, before
the checkpoint is complete. Nothing in ampkit knows about this file.
"""

import os

if "AMPKIT_TEST_DIE_RANK" in os.environ and os.environ.get("RANK") == os.environ["AMPKIT_TEST_DIE_RANK"]:
    import torch.distributed.checkpoint as _dcp

    _real_save = _dcp.save
    _marker = f"step-{int(os.environ['AMPKIT_TEST_DIE_STEP']):08d}"

    def _save_then_die(state_dict, *args, checkpoint_id=None, **kwargs):
        result = _real_save(state_dict, *args, checkpoint_id=checkpoint_id, **kwargs)
        if _marker in str(checkpoint_id):
            os._exit(7)
        return result

    _dcp.save = _save_then_die
