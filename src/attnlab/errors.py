"""Errors that end a run with one readable line instead of a traceback."""


class AttnlabError(Exception):
    """A known failure: bad input, an unavailable kernel, a non-finite value. Printed as one line."""


class ConfigError(AttnlabError):
    """A config key holds a value attnlab does not accept."""

    def __init__(self, key: str, value, accepted: str):
        self.key, self.value, self.accepted = key, value, accepted
        super().__init__(f"{key}={value!r} is not accepted; expected {accepted}")


class KernelUnavailable(AttnlabError):
    """The requested attention kernel cannot run here (device, dtype, mask); never silently replaced."""


class DataError(AttnlabError):
    """The training text or task data cannot be used."""
