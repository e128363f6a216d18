"""One way to parse Python source for the audit, robust to an interpreter bug.

CPython 3.11.7 (and 3.12.1) can raise ``SystemError: AST constructor recursion
depth mismatch`` from :func:`ast.parse` on perfectly valid code when the garbage
collector runs Python finalizers in the middle of building the tree (the check
compares recursion depths taken before and after). The audit reads thousands of
files, so it met the bug now and then. Parsing with the collector paused avoids
it; one retry after a collection covers what is left.
"""

from __future__ import annotations

import ast
import gc
import warnings

#: the parser, looked up here so a test can stand in for it without touching ``ast``
_parse = ast.parse


def parse_source(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` without warnings (invalid escapes are not ours to report)."""
    for attempt in (1, 2):
        enabled = gc.isenabled()
        gc.disable()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return _parse(source, filename=filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == 2:
                raise
            gc.collect()
        finally:
            if enabled:
                gc.enable()
    raise AssertionError("unreachable")
