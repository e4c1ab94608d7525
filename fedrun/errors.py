"""Errors a user can cause and fix.  The CLI prints them as one line and exits non-zero."""


class ConfigError(ValueError):
    """A setting has a value fedrun cannot use.

    The message names the setting, the value and what is allowed, e.g.
    ``aggregator.beta=-1: must be > 0``.
    """

    def __init__(self, setting: str, value, allowed: str):
        self.setting, self.value, self.allowed = setting, value, allowed
        super().__init__(f"{setting}={value}: {allowed}")


class DataError(RuntimeError):
    """A dataset could not be found, read or downloaded."""


class DivergenceError(RuntimeError):
    """The model became NaN or Inf; the run stops with its CSVs intact."""


def check(condition: bool, setting: str, value, allowed: str) -> None:
    """Raise :class:`ConfigError` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(setting, value, allowed)
