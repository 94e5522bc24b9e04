"""User-facing errors: bad input that the user can fix.

Every error here carries a one-line message that names the problem and the fix. The command-line
entry points (:func:`cudt.runner.cli.run_cli`) print it as ``error: <message>`` and exit with status 2;
anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "CudtError", "DataError", "UsageError"]


class CudtError(ValueError):
    """Base class of every user-fixable error raised by cudt. ``cli``: the message in the
    command line's words, where they differ (a flag as the fix); the entry points print it."""

    cli: str | None = None

    def fix_in_words(self, fix: str, where: str = "") -> None:
        """Sets ``cli`` to this error's problem (its message up to the last ``": "``: the fix
        every message ends with), preceded by ``where`` and followed by ``fix``: the command's
        own fix where the library's names something the command does not take."""
        problem = str(self.cli or self).rpartition(": ")[0] or str(self)
        self.cli = f"{where}{problem}: {fix}"


class UsageError(CudtError):
    """Bad flags, config values or output folders."""


class DataError(CudtError):
    """Missing, malformed or unreadable data."""


class CheckpointError(CudtError):
    """A checkpoint that cannot be used: corrupt, or from a different config or model.

    Its message names the fix in the library's words (a folder to use or delete); ``cli`` is the
    same message with the command line's flags (``--out``, ``--overwrite``).
    """

    def __init__(self, message: str, cli: str | None = None):
        super().__init__(message)
        self.cli = cli
