"""The project's exception types.

Every error a user can cause is a :class:`PipelineError`: the CLI prints its
message as one line and exits non-zero, without a traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A user-facing error whose message says what went wrong and what to do."""


class SpecError(PipelineError):
    """A model spec could not be resolved, built or run."""


class DeviceError(PipelineError):
    """The requested device is not available on this machine."""


class ConfigError(PipelineError):
    """A stage config, recipe or pipeline description is invalid."""


class InfeasibleConfig(PipelineError):
    """A valid config that cannot run here (no kernel on this device, a pruned
    model whose forward fails, an export the converter rejects).

    The search records it as a pruned trial with :attr:`reason`; it never
    crashes a study.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
