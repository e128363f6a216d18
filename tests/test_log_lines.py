"""How a job's log line is shown: a progress bar's last state, never a hidden control."""

from __future__ import annotations

from remotemac.engine.jobs import shown_line


def test_a_progress_bar_shows_its_last_state_and_crlf_loses_its_cr():
    assert shown_line(b"epoch 1  10%|#\r 100%|##########| step 7") == " 100%|##########| step 7"
    assert shown_line(b"loss 0.25\r") == "loss 0.25"


def test_a_control_behind_a_carriage_return_keeps_the_whole_line():
    """A hostile job must not hide an escape sequence behind a progress bar: the
    line stays whole (the front ends then show the control and the \\r escaped)."""
    line = b"clear:\x1b[2J cr:over\rwrite bidi:\xe2\x80\xaegnp.exe"
    assert shown_line(line) == line.decode()
