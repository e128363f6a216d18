"""Records write UTC timestamps with ``Z``, like every other record (``cleanup.json`` once
wrote ``+00:00``)."""

from __future__ import annotations

import re
import time

from remotemac.engine.cleanup import Knowledge, build_record


def test_cleanup_record_timestamps_are_utc_with_z_like_every_record() -> None:
    record = build_record(
        host="h",
        name="h",
        fingerprint="SHA256:x",
        started=time.time() - 5,
        dry_run=False,
        answer=None,
        know=Knowledge(),
        extra_items=[],
    ).to_json()
    for key in ("started_at", "finished_at"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record[key]), record[key]
