"""compare_outputs on real files written by torch (CPU) and numpy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from remotemac.acceptance.compare import (
    BFLOAT16_TOL,
    FLOAT16_TOL,
    FLOAT32_TOL,
    CompareRule,
    compare_outputs,
    default_tolerance,
)


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    ref, tgt = tmp_path / "results" / "cpu", tmp_path / "results" / "mps"
    ref.mkdir(parents=True)
    tgt.mkdir(parents=True)
    return ref, tgt


def _model_outputs(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(5, 4)
    return {
        "state_dict": model.state_dict(),
        "preds": [model(x).detach(), x],
        "meta": {"epoch": 3, "name": "tiny"},
    }


def _by_key(file_result: dict) -> dict:
    return {t["key"]: t for t in file_result["tensors"]}


def test_beyond_tolerance_names_file_and_tensor(sides):
    ref, tgt = sides
    out = _model_outputs()
    torch.save(out, ref / "model.pt")
    out["state_dict"]["2.weight"] = out["state_dict"]["2.weight"] + 1e-2
    torch.save(out, tgt / "model.pt")

    res = compare_outputs(ref, tgt, [CompareRule(file="model.pt")]).to_dict()

    assert res["within_tolerance"] is False
    (f,) = res["files"]
    assert f["path"] == "model.pt" and f["ok"] is False
    assert "state_dict.2.weight" in f["detail"]
    tensors = _by_key(f)
    bad = tensors["state_dict.2.weight"]
    assert bad["ok"] is False
    assert bad["max_abs_err"] == pytest.approx(1e-2, rel=1e-3)
    assert "outside rtol=1.3e-06 atol=1e-05" in bad["detail"]
    assert bad["shape"] == [2, 8] and bad["dtype"] == "float32"
    assert all(t["ok"] for k, t in tensors.items() if k != "state_dict.2.weight")
    assert {"preds[0]", "preds[1]", "meta.epoch", "meta.name", "state_dict.0.bias"} <= set(tensors)


def test_within_tolerance_is_ok(sides):
    ref, tgt = sides
    out = _model_outputs()
    torch.save(out, ref / "model.pt")
    # float32 round-off of the kind MPS vs CPU produces: well inside rtol 1.3e-6
    out["preds"][0] = out["preds"][0] * (1 + 2e-7)
    torch.save(out, tgt / "model.pt")

    res = compare_outputs(ref, tgt, [CompareRule(file="model.pt")]).to_dict()

    assert res["within_tolerance"] is True
    (f,) = res["files"]
    assert f["ok"] is True and f["detail"] == ""
    assert 0 < f["max_abs_err"] < 1e-5
    assert (f["rtol"], f["atol"]) == FLOAT32_TOL  # defaults for float32
    assert set(f) >= {
        "path",
        "max_abs_err",
        "max_rel_err",
        "rtol",
        "atol",
        "ok",
        "detail",
        "tensors",
    }
    assert set(f["tensors"][0]) >= {
        "key",
        "shape",
        "dtype",
        "max_abs_err",
        "max_rel_err",
        "ok",
        "detail",
    }


def test_rule_tolerance_overrides_dtype_default(sides):
    ref, tgt = sides
    torch.save(torch.ones(3), ref / "p.pt")
    torch.save(torch.ones(3) + 1e-3, tgt / "p.pt")
    loose = compare_outputs(ref, tgt, [CompareRule(file="p.pt", rtol=1e-2, atol=0.0)]).to_dict()
    strict = compare_outputs(ref, tgt, [CompareRule(file="p.pt")]).to_dict()
    assert loose["within_tolerance"] is True
    assert loose["files"][0]["rtol"] == 1e-2
    assert strict["within_tolerance"] is False
    assert _by_key(strict["files"][0])["(root)"]["ok"] is False


def test_default_tolerances_follow_pytorch_mps_tests(sides):
    assert default_tolerance("float32") == (1.3e-6, 1e-5)
    assert default_tolerance("float16") == (5e-2, 5e-2) == FLOAT16_TOL
    assert default_tolerance("bfloat16") == (1e-1, 5e-2) == BFLOAT16_TOL
    assert default_tolerance("int64") == (0.0, 0.0)
    ref, tgt = sides
    base = torch.linspace(1, 2, 10)
    diff = 1e-2  # fine for half precision, far too much for float32
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        name = str(dtype).replace("torch.", "")
        torch.save(base.to(dtype), ref / f"{name}.pt")
        torch.save((base + diff).to(dtype), tgt / f"{name}.pt")
    res = compare_outputs(ref, tgt, [CompareRule(file="*.pt")]).to_dict()
    ok = {f["path"]: f["ok"] for f in res["files"]}
    assert ok == {"bfloat16.pt": True, "float16.pt": True, "float32.pt": False}
    assert _by_key(res["files"][0])["(root)"]["dtype"] == "bfloat16"


def test_dtype_and_shape_mismatch(sides):
    ref, tgt = sides
    torch.save({"a": torch.zeros(2, 3), "b": torch.zeros(2, 3)}, ref / "x.pt")
    torch.save({"a": torch.zeros(2, 3, dtype=torch.float16), "b": torch.zeros(3, 2)}, tgt / "x.pt")
    res = compare_outputs(ref, tgt, [CompareRule(file="x.pt")]).to_dict()
    t = _by_key(res["files"][0])
    assert t["a"]["ok"] is False and "dtype float16 vs reference float32" in t["a"]["detail"]
    assert t["b"]["ok"] is False and "shape [3, 2] vs reference [2, 3]" in t["b"]["detail"]
    assert res["within_tolerance"] is False


def test_structure_mismatch_missing_and_extra_keys(sides):
    ref, tgt = sides
    torch.save({"a": torch.zeros(2), "b": torch.zeros(2)}, ref / "x.pt")
    torch.save({"a": torch.zeros(2), "c": torch.zeros(2)}, tgt / "x.pt")
    t = _by_key(compare_outputs(ref, tgt, [CompareRule(file="x.pt")]).to_dict()["files"][0])
    assert t["a"]["ok"] is True
    assert (t["b"]["ok"], t["b"]["detail"]) == (False, "missing in target")
    assert (t["c"]["ok"], t["c"]["detail"]) == (False, "not in reference")


def test_npz_names_the_array(sides):
    ref, tgt = sides
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((4, 3)).astype(np.float32), np.arange(4)
    np.savez(ref / "out.npz", logits=logits, labels=labels)
    bad = labels.copy()
    bad[2] = 7
    np.savez(tgt / "out.npz", logits=logits, labels=bad)
    res = compare_outputs(ref, tgt, [CompareRule(file="*.npz")]).to_dict()
    t = _by_key(res["files"][0])
    assert t["logits"]["ok"] is True and t["logits"]["max_abs_err"] == 0.0
    assert t["labels"]["ok"] is False  # integers are compared exactly
    assert "worst at [2]: 7 vs reference 2" in t["labels"]["detail"]


def test_json_numbers_at_any_depth(sides):
    ref, tgt = sides
    doc = {
        "metrics": {"loss": 0.25, "per_class": [[0.5, 0.25], [0.125, 1.0]]},
        "history": [{"epoch": 1, "acc": 0.9}, {"epoch": 2, "acc": 0.95}],
        "model": "tiny",
        "converged": True,
    }
    (ref / "metrics.json").write_text(json.dumps(doc))
    doc["history"][1]["acc"] = 0.96
    doc["metrics"]["per_class"][1][0] = 0.125 + 1e-9
    doc["model"] = "tiny2"
    (tgt / "metrics.json").write_text(json.dumps(doc))
    res = compare_outputs(ref, tgt, [CompareRule(file="metrics.json", rtol=1e-4, atol=1e-5)])
    t = _by_key(res.to_dict()["files"][0])
    assert t["history[1].acc"]["ok"] is False
    assert t["history[1].acc"]["max_abs_err"] == pytest.approx(0.01)
    assert t["metrics.per_class"]["ok"] is True and t["metrics.per_class"]["shape"] == [2, 2]
    assert t["model"]["ok"] is False and "'tiny2' vs reference 'tiny'" in t["model"]["detail"]
    assert t["converged"]["ok"] is True
    assert t["history[0].epoch"]["ok"] is True


def test_csv_numeric_and_text_cells(sides):
    ref, tgt = sides
    (ref / "log.csv").write_text("step,loss,split\n1,0.5,train\n2,0.25,train\n3,0.125,val\n")
    (tgt / "log.csv").write_text("step,loss,split\n1,0.5,train\n2,0.3,train\n3,0.125,test\n")
    res = compare_outputs(ref, tgt, [CompareRule(file="log.csv", rtol=1e-4, atol=1e-5)]).to_dict()
    t = _by_key(res["files"][0])
    assert t["step"]["ok"] is True and t["step"]["shape"] == [3]
    assert t["loss"]["ok"] is False and t["loss"]["max_abs_err"] == pytest.approx(0.05)
    assert t["split"]["ok"] is False and "row 2: 'test' vs reference 'val'" in t["split"]["detail"]
    (tgt / "log.csv").write_text("step,loss,split\n1,0.5,train\n")
    t = _by_key(compare_outputs(ref, tgt, [CompareRule(file="log.csv")]).to_dict()["files"][0])
    assert t["loss"]["detail"] == "1 rows vs reference 3"


def test_nan_positions_must_agree(sides):
    ref, tgt = sides
    nan = float("nan")
    np.save(ref / "a.npy", np.array([1.0, nan, 3.0, np.inf], dtype=np.float32))
    np.save(tgt / "a.npy", np.array([1.0, nan, 3.0, np.inf], dtype=np.float32))
    np.save(ref / "b.npy", np.array([1.0, nan, 3.0], dtype=np.float32))
    np.save(tgt / "b.npy", np.array([1.0, 2.0, nan], dtype=np.float32))
    res = compare_outputs(ref, tgt, [CompareRule(file="*.npy")]).to_dict()
    a, b = res["files"]
    assert (a["path"], a["ok"], a["max_abs_err"]) == ("a.npy", True, 0.0)
    assert b["ok"] is False
    assert "NaN positions differ at 2 of 3 elements, first at [1]" in b["tensors"][0]["detail"]


def test_infinity_against_finite_fails(sides):
    ref, tgt = sides
    np.save(ref / "a.npy", np.array([1.0, 2.0]))
    np.save(tgt / "a.npy", np.array([1.0, np.inf]))
    (f,) = compare_outputs(ref, tgt, [CompareRule(file="a.npy")]).to_dict()["files"]
    assert f["ok"] is False and f["max_abs_err"] is None  # strict JSON: no Infinity
    assert "infinite error" in f["tensors"][0]["detail"]


def test_missing_files_are_not_compared_never_outside_tolerance(sides):
    """Issue 34: a file on one side only, or a rule that matches no file, is reported
    "not compared: why": the comparison is incomplete (None), not failed."""
    ref, tgt = sides
    (ref / "preds").mkdir()
    (tgt / "preds").mkdir()
    for name in ("a.pt", "b.pt"):
        torch.save(torch.ones(2), ref / "preds" / name)
    torch.save(torch.ones(2), tgt / "preds" / "a.pt")
    torch.save(torch.ones(2), tgt / "preds" / "extra.pt")
    res = compare_outputs(
        ref, tgt, [CompareRule(file="preds/*.pt"), CompareRule(file="metrics.json")]
    )
    files = {f.path: f for f in res.files}
    assert res.within_tolerance is None
    assert files["preds/a.pt"].ok is True
    assert files["preds/b.pt"].ok is None
    assert files["preds/b.pt"].detail.startswith("not compared: missing in target outputs")
    assert files["preds/extra.pt"].not_compared.startswith("missing in reference outputs")
    assert files["metrics.json"].ok is None
    assert "no file matches 'metrics.json'" in files["metrics.json"].detail


def test_link_out_of_the_output_dir_is_not_followed(sides, tmp_path):
    ref, tgt = sides
    secret = tmp_path / "secret.npy"
    np.save(secret, np.ones(2))
    np.save(ref / "a.npy", np.ones(2))
    (tgt / "a.npy").symlink_to(secret)
    (f,) = compare_outputs(ref, tgt, [CompareRule(file="a.npy")]).files
    assert f.ok is None and f.not_compared.startswith("missing in target")


def test_unreadable_and_unsupported_files(sides):
    ref, tgt = sides
    torch.save(torch.ones(2), ref / "m.pt")
    (tgt / "m.pt").write_bytes(b"not a checkpoint")
    (ref / "notes.txt").write_text("a")
    (tgt / "notes.txt").write_text("b")
    res = compare_outputs(ref, tgt, [CompareRule(file="m.pt"), CompareRule(file="notes.txt")])
    m, notes = res.files
    assert res.within_tolerance is None  # unreadable is not "outside tolerance"
    assert m.ok is None and m.not_compared.startswith("target: cannot load with torch.load")
    assert notes.ok is None and "unsupported file type '.txt'" in notes.detail
    assert notes.detail.startswith("not compared: ")


def test_byte_identical_files_pass_without_loading(sides):
    """Issue 34: two files with the same bytes are the same result, whatever their type:
    a whole-model pickle the safe loader refuses, a file no loader knows."""
    ref, tgt = sides
    for side in sides:
        (side / "model.pt").write_bytes(b"\x80\x04 a pickle the safe loader would refuse")
        (side / "notes.txt").write_text("same")
    res = compare_outputs(ref, tgt, [CompareRule(file="*.pt"), CompareRule(file="*.txt")])
    assert res.within_tolerance is True
    assert all(f.identical and f.ok for f in res.files)
    assert all(f.detail == "byte-identical: passed without loading" for f in res.files)


def test_no_rules_is_not_evidence(sides):
    ref, tgt = sides
    assert compare_outputs(ref, tgt, []).to_dict() == {"within_tolerance": None, "files": []}


def test_numpy_formats_work_without_torch(sides):
    """torch is made unimportable in a fresh interpreter: .npy/.npz/.json/.csv still compare,
    and a .pt file fails with a clear detail instead of an ImportError."""
    ref, tgt = sides
    for side, loss in ((ref, 0.5), (tgt, 0.75)):
        tiny = 1e-9 if side == tgt else 0.0  # within tolerance, not byte-identical
        np.save(side / "a.npy", np.arange(3.0) + tiny)
        np.savez(side / "b.npz", x=np.arange(2.0) + tiny)
        (side / "m.json").write_text(json.dumps({"loss": loss}))
        (side / "l.csv").write_text(f"loss\n{0.1 + tiny!r}\n")
        (side / "w.pt").write_bytes(b"x" if side == ref else b"y")
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["torch"] = None  # import torch -> ImportError
        from remotemac.acceptance.compare import CompareRule, compare_outputs
        res = compare_outputs({str(ref)!r}, {str(tgt)!r},
                              [CompareRule(file=p) for p in ("*.npy", "*.npz", "*.json", "*.csv",
                                                        "*.pt")])
        print(json.dumps({{f.path: [f.ok, f.detail] for f in res.files}}))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["a.npy"] == [True, ""] and got["b.npz"] == [True, ""]
    assert got["l.csv"] == [True, ""]
    assert got["m.json"][0] is False and "loss" in got["m.json"][1]
    assert got["w.pt"][0] is None and "torch is not installed" in got["w.pt"][1]
