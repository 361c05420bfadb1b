"""Text from a capture made safe to print: no terminal control sequences.

Point names, file names, error messages and failure reasons come from files anyone can
write; printed raw, an ESC sequence in one can clear the screen, retitle the terminal or
hide lines. Every character that is not printable is shown as its escape instead.
"""

from __future__ import annotations

from rich.markup import escape


def printable(text: object) -> str:
    """``text`` with every control or non-printable character escaped (``\\x1b``, ``\\u202e``)."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else _escaped(c) for c in value)


def markup(text: object) -> str:
    """``printable(text)`` with rich markup escaped, for use inside a markup string."""
    return escape(printable(text))


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
