"""Errors shared by every part of clouseau.

Every error clouseau raises on purpose derives from :class:`ClouseauError`, so a user can
catch them all with one clause. Each message names the cause and the fix.
"""

from __future__ import annotations


class ClouseauError(Exception):
    """Base class of every error clouseau raises on purpose."""


class VerificationError(ClouseauError, ValueError):
    """The IR breaks an invariant; the message names the offending node."""


class SelectionError(ClouseauError, ValueError):
    """A ``select`` matched nothing or is not a valid selection."""


class TraceError(ClouseauError, RuntimeError):
    """A model could not be traced into the IR."""


class ArgumentError(ClouseauError, TypeError):
    """The arguments of a call do not fit the model's signature (count or names)."""


class CaptureError(ClouseauError, OSError):
    """A capture could not be written or read (path, disk, file format)."""


class MissingExtraError(ClouseauError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed; install it with: pip install 'clouseau[{extra}]'"
        )
