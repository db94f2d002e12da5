"""The one exception type for user mistakes.

A `UsageError` is something the user can fix (bad flag, missing file, unsupported precision on
this device). The CLI prints its message on one line and exits with code 2, no traceback.
Messages name the problem *and* the fix.
"""


class UsageError(Exception):
    """A user-fixable problem; the message names the problem and the fix."""


class TrainingError(Exception):
    """A run that cannot continue (e.g. the loss scale collapsed below its floor)."""


class RunDiverged(TrainingError):
    """The loss went non-finite (or the loss scale collapsed) and no NaN guard was on: the run ends
    without writing the non-finite state; the message names the step and the next command."""


class RunInterrupted(TrainingError):
    """SIGINT/SIGTERM stopped a run gracefully (after a checkpoint); the exit code is 128 + signal."""

    def __init__(self, message: str, *, signum: int):
        super().__init__(message)
        self.signum = signum
