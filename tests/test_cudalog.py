from pathlib import Path

from remotemac.acceptance.cudalog import scan_log


def test_cuda_signs_are_found_with_line_numbers(tmp_path: Path):
    log = tmp_path / "mps.log"
    log.write_text(
        "epoch 1\nAssertionError: Torch not compiled with CUDA enabled\nok\n"
        "RuntimeError: No CUDA GPUs are available\n"
        "OSError: libcudart.so.12: cannot open shared object file\n"
        "the word cudaless is fine\n"
    )
    hits = scan_log(log)
    assert [h["line_no"] for h in hits] == [2, 4, 5]
    assert "not compiled" in hits[0]["line"]


def test_clean_log_has_no_hits(tmp_path: Path):
    log = tmp_path / "mps.log"
    log.write_text("training on mps\nloss 0.1\nCUDA-free since 2024\n")
    assert scan_log(log) == []
    assert scan_log(tmp_path / "missing.log") == []
