"""The one placeholder syntax of a workload's command, for ``run``, ``preflight`` and ``check``.

``{device}``, ``{data_dir}``, ``{output_dir}`` and ``{matrix.<key>}`` are filled in,
each value shell-quoted. ``{{`` is a literal brace, and so is the ``}}`` that closes
it (``{{x}}`` reaches the job as ``{x}``). Braces that cannot be a
placeholder are the command's own and are left as written: a dict literal
(``python -c "d={'a': 1}"``), ``find -exec {} +``, awk's ``'{print $1}'``, shell brace
expansion ``{a,b}`` and ``${VAR}``. Only a brace around a bare name (``{devcie}``,
``{x}``) is taken for a placeholder, so a typo is an error, not a literal that reaches
the job; the error says how to write the brace itself.

Why not ``str.format``: it refuses every one of the commands above (a lone ``}``, a
format spec after ``:``), and ``preflight`` and ``run`` had drifted apart (one used
``str.replace``: ``{{x}}`` reached the job as ``{{x}}`` there and ``{x}`` under ``run``).
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterator, Mapping

#: the names every command may use, besides {matrix.<key>}
NAMES = ("device", "data_dir", "output_dir")
_NAME = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\}")


class PlaceholderError(ValueError):
    """A name in braces that is no placeholder (a ValueError: pydantic reports it)."""


def _pieces(command: str) -> Iterator[tuple[str, str | None]]:
    """(literal text, placeholder name or None) in order; escapes already undone.

    ``{{`` is one ``{``; ``}}`` is one ``}`` when it closes such a ``{{`` (``{{x}}``,
    ``'{{}}'``), else it is the command's own (the end of ``{'a': {'b': 1}}``).
    """
    i, n = 0, len(command)
    literal: list[str] = []
    escaped = 0  # ``{{`` not yet closed by ``}}``
    while i < n:
        ch = command[i]
        if ch == "{" and command.startswith("{{", i):
            literal.append("{")
            escaped += 1
            i += 2
            continue
        if ch == "}" and escaped and command.startswith("}}", i):
            literal.append("}")
            escaped -= 1
            i += 2
            continue
        if ch == "{" and not (i and command[i - 1] == "$"):
            match = _NAME.match(command, i)
            if match:
                yield "".join(literal), match.group(1)
                literal = []
                i = match.end()
                continue
        literal.append(ch)
        i += 1
    yield "".join(literal), None


def names(command: str) -> list[str]:
    """Every placeholder name the command uses, in order (``matrix.bs`` as is)."""
    return [name for _, name in _pieces(command) if name is not None]


def check(command: str, matrix_ok: bool = True) -> None:
    """Raise PlaceholderError for the first name in braces that is no placeholder."""
    for name in names(command):
        if name in NAMES or (matrix_ok and name.startswith("matrix.")):
            continue
        close = difflib.get_close_matches(name, NAMES, n=1)
        guess = f"did you mean {{{close[0]}}}? " if close else ""
        raise PlaceholderError(
            f"unknown placeholder {{{name}}}: {guess}known: "
            + ", ".join("{" + p + "}" for p in NAMES)
            + ", {matrix.<key>}; "
            + f"a literal brace is written twice: {{{{{name}}}}} reaches the job as {{{name}}}"
        )


class _Escaper:
    """Writes literal text so that ``_pieces`` reads it back as it was (``keep``)."""

    def __init__(self) -> None:
        self.escaped = 0

    def __call__(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            if ch == "{":
                out.append("{{")
                self.escaped += 1
            elif ch == "}" and self.escaped:
                out.append("}}")
                self.escaped -= 1
            else:
                out.append(ch)
        return "".join(out)


def expand(
    command: str,
    values: Mapping[str, str],
    matrix: Mapping[str, object] | None = None,
    keep: bool = False,
) -> str:
    """Fill the placeholders of ``command`` with shell-quoted ``values``/``matrix``.

    ``keep``: a first pass (the matrix, before the device is known): placeholders with
    no value stay as written and literal braces stay escaped, so the result expands
    the same later. Otherwise a name with no value is a PlaceholderError.
    """
    filled = {k: shlex.quote(v) for k, v in values.items()}
    for key, value in (matrix or {}).items():
        filled["matrix." + key] = shlex.quote(str(value))
    out: list[str] = []
    _escape = _Escaper()
    for literal, name in _pieces(command):
        out.append(_escape(literal) if keep else literal)
        if name is None:
            continue
        if name in filled:
            out.append(_escape(filled[name]) if keep else filled[name])
        elif keep:
            out.append("{" + name + "}")
        else:
            check("{" + name + "}")  # the hint for a name that is no placeholder
            raise PlaceholderError(f"no value for the placeholder {{{name}}}")
    return "".join(out)
