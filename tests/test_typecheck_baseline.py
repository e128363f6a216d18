"""scripts/typecheck.py: a new mypy error fails CI, a known one (in the baseline) does not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _typecheck():
    spec = importlib.util.spec_from_file_location("typecheck", REPO / "scripts" / "typecheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_new_error_fails_and_a_fixed_one_is_reported(tmp_path, monkeypatch, capsys) -> None:
    tc = _typecheck()
    known = "remotemac/engine/x.py: [arg-type] Argument 1 has incompatible type"
    gone = "remotemac/engine/y.py: [index] Value of type object is not indexable"
    baseline = tmp_path / "baseline.txt"
    baseline.write_text(f"{known}\n{gone}\n")
    monkeypatch.setattr(tc, "BASELINE", baseline)
    monkeypatch.setattr(tc, "current", lambda: [known])
    assert tc.main() == 0
    assert f"fixed (remove from the baseline): {gone}" in capsys.readouterr().out
    new = "remotemac/transport/z.py: [return-value] Incompatible return value type"
    monkeypatch.setattr(tc, "current", lambda: sorted([known, new]))
    assert tc.main() == 1
    assert f"new type error: {new}" in capsys.readouterr().out


def test_mypy_output_lines_become_baseline_lines() -> None:
    match = _typecheck().ERROR.match(
        'remotemac/engine/plan.py:24: error: Argument 1 to "select_slice" has incompatible '
        'type "Path | None"; expected "Path"  [arg-type]'
    )
    assert match and match["path"] == "remotemac/engine/plan.py" and match["code"] == "arg-type"
