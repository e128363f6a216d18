"""Host-supplied names in cleanup's plan are shown escaped, never obeyed by the terminal."""

from __future__ import annotations

from remotemac.engine.cleanup import CleanupRecord, _plan_lines


def test_cleanup_dry_run_shows_host_names_escaped():
    record = {
        "host": "mac",
        "bytes_to_free": 10,
        "items": [
            {
                "fate": "would remove",
                "kind": "run",
                "path": "/r/runs/x\x1b]52;c;QUJD\x07",
                "bytes": 10,
            },
            {"fate": "left alone", "kind": "root", "path": "/r", "why": "holds \x1b[2Jevil"},
        ],
    }
    text = "\n".join(_plan_lines(CleanupRecord.from_json(record)))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]52" in text or "^[" in text or "\\e" in text  # shown, not obeyed
