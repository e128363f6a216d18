"""The base of the ``PythonScanner`` mixins (imports, guards, calls)."""

from __future__ import annotations

from typing import Any


class ScannerMixin:
    """``PythonScanner`` owns the state its mixins read (``flow``, ``guard``,
    ``optional``, ``depth``, ``branch``, ``scopes``, ``names``) and the visitor
    plumbing declared here."""

    hit: Any
    visit: Any
    visit_all: Any
    visit_block: Any
    generic_visit: Any
    dotted: Any
