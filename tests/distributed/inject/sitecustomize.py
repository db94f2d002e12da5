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

# In the worker whose RANK equals AMPKIT_TEST_HANG_RANK, the AMPKIT_TEST_HANG_STEP-th optimizer step
# never returns: the rank hangs outside any collective, as a rank stuck in its data or host code does,
# and its peers wait for it at their next collective. SIGTERM is put back to its default first, so
# the launcher's stop ends the sleeper at once (a rank stuck in C code waits for torchrun's SIGKILL).
if "AMPKIT_TEST_HANG_RANK" in os.environ and os.environ.get("RANK") == os.environ["AMPKIT_TEST_HANG_RANK"]:
    import signal as _signal
    import time as _time

    import torch as _torch

    _real_step = _torch.optim.AdamW.step
    _calls = [0]

    def _step_or_hang(self, *args, **kwargs):
        _calls[0] += 1
        if _calls[0] == int(os.environ["AMPKIT_TEST_HANG_STEP"]):
            _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
            _time.sleep(3600)
        return _real_step(self, *args, **kwargs)

    _torch.optim.AdamW.step = _step_or_hang
