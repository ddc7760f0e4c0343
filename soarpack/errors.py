"""One exception family for every failure a user can act on.

The CLI turns a SoarpackError into one red line (the cause), an optional hint (what to do), and exit code 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SoarpackError(Exception):
    """A failure with a plain cause and, where we know it, the fix."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class ConfigError(SoarpackError):
    """A config.json, recipe, profile or flag that is malformed or contradicts itself."""


class CheckpointError(SoarpackError):
    """A checkpoint directory that is missing files, tensors or has wrong shapes."""


class InputDataError(SoarpackError):
    """A data file (JSONL, text) that cannot be read as promised."""


class OutputExistsError(SoarpackError):
    """An output path that exists and would be overwritten without --force."""


class HostError(SoarpackError):
    """This machine cannot do what was asked (a read-only cache folder, say): the input is not at fault, so a
    check reports it as an error of its own, never as a failed step of the bundle."""
