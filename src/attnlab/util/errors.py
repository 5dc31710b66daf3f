"""Errors that end a run with one readable line instead of a traceback."""


class AttnlabError(Exception):
    """A known failure: bad input, an unavailable kernel, a non-finite value. Printed as one line."""

    exit_code = 2  # bad input; faults met during a run exit 1 (RunFault)


class ConfigError(AttnlabError):
    """A config key holds a value attnlab does not accept."""

    def __init__(self, key: str, value, accepted: str):
        self.key, self.value, self.accepted = key, value, accepted
        super().__init__(f"{key}={value!r} is not accepted; expected {accepted}")


class KernelUnavailable(AttnlabError):
    """The requested attention kernel cannot run here (device, dtype, mask); never silently replaced."""


class DataError(AttnlabError):
    """The training text or task data cannot be used."""


class CheckpointError(AttnlabError):
    """A checkpoint file that cannot be used: unreadable, truncated, damaged, or not attnlab's."""

    def __init__(self, path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"checkpoint {path} {problem}")


class RunFault(AttnlabError):
    """A fault met while the run was going (a write that failed, memory that ran out): exit 1, not 2."""

    exit_code = 1


class WriteFailed(RunFault):
    """A checkpoint or results.json could not be written; the file it would have replaced is intact."""

    def __init__(self, message: str, path=None):
        self.path = path
        super().__init__(message)


class OutOfMemory(RunFault):
    """The run needs more memory than the device has (estimated before training, or met during it)."""
