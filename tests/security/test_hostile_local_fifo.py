"""Issue 15 item 8 (and 5's pull part): with the ``local`` host, a FIFO or device where
pull expects a file is refused cleanly, never opened.

Before the fix, a FIFO at ``status/<label>.obs.json`` made ``pull`` fail with
"internal error: SpecialFileError" (shutil.copy), and a FIFO opened for reading
would block for ever waiting for a writer. Real files, a real FIFO, the real
LocalTransport; the run context is a stand-in with the four attributes pull uses.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from remotemac.engine.context import Side
from remotemac.engine.pull import fetch_evidence
from remotemac.errors import UnsafePath
from remotemac.transport.local import LocalTransport

pytestmark = pytest.mark.timeout(30)


def test_fifo_evidence_is_skipped_with_a_warning_and_never_opened(tmp_path: Path):
    run_dir = tmp_path / "host" / "runs" / "r1"
    (run_dir / "status").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    os.mkfifo(run_dir / "status" / "cpu.obs.json")
    (run_dir / "logs" / "cpu.metrics.jsonl").write_text('{"m": 1}\n')
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    events = []
    transport = LocalTransport()
    ctx = SimpleNamespace(
        host_for=lambda _side: SimpleNamespace(transport=transport),
        out_dir=out,
        emit=events.append,
        run_id="r1",
    )
    side = Side("target", "cpu", "cpu", "remote")
    fetched = asyncio.run(fetch_evidence(ctx, side, str(run_dir)))
    assert fetched == ["cpu.metrics.jsonl"]
    assert (out / "logs" / "cpu.metrics.jsonl").read_text() == '{"m": 1}\n'
    assert not (out / "logs" / "cpu.obs.json").exists()
    assert any("cpu.obs.json not read" in e.message and "other" in e.message for e in events)


def test_local_download_refuses_a_fifo_instead_of_blocking(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with (tmp_path / "dest").open("wb") as dst, pytest.raises(UnsafePath):
        asyncio.run(LocalTransport().download_to(str(fifo), dst, 0, limit=10))
