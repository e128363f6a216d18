"""Make text from the job or the host safe to show on a terminal.

Why: a workload's output and a host's answers are not trusted. A terminal acts on
escape sequences: OSC 52 writes the user's clipboard, OSC 0 retitles the window,
``ESC[2J`` clears the screen (and can hide what came before), a bare ``\\r`` or
backspace overwrites what is shown, and bidi overrides reorder it. Everything
remotemac shows from the job or the host goes through :func:`escape_controls`, which
keeps tab and newline and shows every other C0/C1 control (and DEL, and the bidi
controls) as a visible ``\\xNN``/``\\uNNNN`` escape. ``--raw`` on ``logs`` and ``run``
skips it for users who want their job's colours.
"""

from __future__ import annotations

import re

#: C0 except \t and \n, DEL, C1, and the Unicode bidi embeddings/overrides/isolates
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control that a terminal would act on shown, not obeyed.

    A CRLF line end becomes a plain newline first (Windows-style output is common
    and harmless); any other carriage return is shown as ``\\x0d``.
    """
    if not text:
        return text
    return _CONTROLS.sub(_visible, text.replace("\r\n", "\n"))


def has_controls(text: str) -> bool:
    """True when :func:`escape_controls` would change something other than a CRLF."""
    return bool(_CONTROLS.search(text.replace("\r\n", "\n")))
