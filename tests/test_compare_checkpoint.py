"""Issue 17: checkpoints that store paths and device names compare on what matters.

Real torch checkpoints (a model's state_dict, AdamW state, an iteration count and a
config dict), written by torch.save and loaded by the comparison as it runs in a
pipeline.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from remotemac.acceptance.compare import CompareRule, compare_outputs, key_matches
from remotemac.acceptance.loaders import LoadError, read_safetensors


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    ref, tgt = tmp_path / "cpu-reference", tmp_path / "cpu-target"
    ref.mkdir()
    tgt.mkdir()
    return ref, tgt


def _checkpoint(out_dir: str, device: str, *, perturb: str | None = None) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(2):
        loss = model(torch.randn(3, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    state = model.state_dict()
    if perturb:
        state[perturb] = state[perturb] + 1e-2
    return {
        "model": state,
        "optimizer": opt.state_dict(),
        "iter_num": 2,
        "best_val_loss": float(loss.detach()),
        "device_obj": torch.device(device),
        "config": {
            "out_dir": out_dir,
            "device": device,
            "n_layer": 2,
            "saved_at": f"2026-11-30T16:0{len(out_dir) % 10}:00Z",
        },
    }


def _save_pair(
    ref: Path,
    tgt: Path,
    *,
    ref_device: str = "cpu",
    tgt_device: str = "mps:0",
    perturb: str | None = None,
) -> None:
    torch.save(_checkpoint(str(ref / "out"), ref_device), ref / "ckpt.pt")
    torch.save(_checkpoint(str(tgt / "out-other"), tgt_device, perturb=perturb), tgt / "ckpt.pt")


def _file(ref: Path, tgt: Path, rule: CompareRule) -> dict:
    return compare_outputs(ref, tgt, [rule]).to_dict()["files"][0]


@pytest.mark.slow
def test_paths_devices_and_timestamps_are_metadata_not_failures(sides):
    """Before issue 17 the out_dir string alone rejected a bit-identical checkpoint."""
    ref, tgt = sides
    _save_pair(ref, tgt)
    f = _file(ref, tgt, CompareRule(file="ckpt.pt", rtol=1e-5, atol=1e-6))
    assert f["ok"] is True, f["detail"]
    meta = {m["key"] for m in f["metadata_differences"]}
    assert meta == {"config.out_dir", "config.saved_at"}
    keys = {t["key"]: t for t in f["tensors"]}
    # device names are normalised: cpu vs mps:0 is not even a metadata difference
    assert keys["config.device"]["ok"] is True and "normalised" in keys["config.device"]["detail"]
    assert keys["device_obj"]["ok"] is True
    # the optimizer state and numbers were compared, not skipped
    assert {
        "optimizer.state.0.exp_avg",
        "optimizer.param_groups[0].betas[1]",
        "iter_num",
        "best_val_loss",
        "model.2.weight",
    } <= set(keys)
    assert f["compared"] == len(f["tensors"]) and f["first_failing_key"] is None


def test_a_perturbed_weight_is_named_first_and_worst(sides):
    ref, tgt = sides
    _save_pair(ref, tgt, perturb="2.weight")
    f = _file(ref, tgt, CompareRule(file="ckpt.pt", rtol=1e-5, atol=1e-6))
    assert f["ok"] is False
    assert f["first_failing_key"] == "model.2.weight"
    assert f["worst"][0]["key"] == "model.2.weight"
    assert f["worst"][0]["max_abs_err"] == pytest.approx(1e-2, rel=1e-3)
    assert "first: model.2.weight" in f["detail"]
    assert "config.out_dir" not in f["detail"].split("metadata")[0]


def test_strict_makes_metadata_fail(sides):
    ref, tgt = sides
    _save_pair(ref, tgt)
    f = _file(ref, tgt, CompareRule(file="ckpt.pt", rtol=1e-5, atol=1e-6, strict=True))
    assert f["ok"] is False and f["first_failing_key"] == "config.out_dir"
    assert "fail (strict)" in f["detail"]
    # a device name stays normalised even when strict
    assert all(t["ok"] for t in f["tensors"] if t["key"] in ("config.device", "device_obj"))


def test_keys_and_ignore_globs(sides):
    ref, tgt = sides
    _save_pair(ref, tgt, perturb="0.bias")
    only_opt = _file(ref, tgt, CompareRule(file="ckpt.pt", keys=("optimizer.*",), strict=True))
    assert only_opt["ok"] is True
    assert all(t["key"].startswith("optimizer.") for t in only_opt["tensors"])
    assert only_opt["ignored"] > 0
    skip = _file(
        ref, tgt, CompareRule(file="ckpt.pt", ignore=("model.0.bias", "config"), strict=True)
    )
    assert skip["ok"] is True, skip["detail"]
    assert not any(t["key"].startswith(("config", "model.0.bias")) for t in skip["tensors"])
    none = _file(ref, tgt, CompareRule(file="ckpt.pt", keys=("nothing.*",)))
    assert none["ok"] is False and "no key of" in none["detail"]


def test_glob_semantics():
    assert key_matches("optimizer.param_groups[0].lr", ("optimizer.param_groups[0]",))
    assert key_matches("model.h.0.attn.weight", ("model.*.weight",))
    assert key_matches("config.out_dir", ("config",))
    assert not key_matches("configs.x", ("config",))
    assert not key_matches("model.h.0.attn.bias", ("model.*.weight",))


def _write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int], bytes]], meta: dict[str, str]
) -> None:
    header, body = {"__metadata__": meta}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(body), len(body) + len(raw)],
        }
        body += raw
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + body)


def _bf16(values: np.ndarray) -> bytes:
    return (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def test_safetensors_without_the_library(sides):
    ref, tgt = sides
    w = np.linspace(-1, 1, 6, dtype=np.float32)
    for side, delta, where in ((ref, 0.0, "/ref/run"), (tgt, 0.5, "/tgt/run")):
        _write_safetensors(
            side / "model.safetensors",
            {
                "w": ("F32", [2, 3], (w + delta * (np.arange(6) == 4)).astype("<f4").tobytes()),
                "h": ("BF16", [3], _bf16(np.array([1.0, 2.0, 3.0]))),
                "step": ("I64", [], np.array(7, dtype="<i8").tobytes()),
            },
            {"format": "pt", "out_dir": where},
        )
    tensors, meta = read_safetensors(ref / "model.safetensors")
    assert tensors["h"].dtype == "bfloat16" and tensors["h"].array.tolist() == [1.0, 2.0, 3.0]
    assert tensors["step"].array.shape == () and meta["out_dir"] == "/ref/run"
    f = _file(ref, tgt, CompareRule(file="*.safetensors", rtol=1e-5, atol=1e-6))
    assert f["ok"] is False and f["first_failing_key"] == "w"
    assert "worst at [1, 1]" in {t["key"]: t for t in f["tensors"]}["w"]["detail"]
    assert [m["key"] for m in f["metadata_differences"]] == ["__metadata__.out_dir"]
    (tgt / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(LoadError, match="header size"):
        read_safetensors(tgt / "model.safetensors")


def test_json_csv_npz_follow_the_same_rules(sides):
    ref, tgt = sides
    for side, path in ((ref, "/a/out"), (tgt, "/b/out")):
        (side / "m.json").write_text(
            json.dumps({"loss": 0.5, "out_dir": path, "device": "cpu" if side is ref else "mps"})
        )
        (side / "l.csv").write_text(f"step,loss,ckpt\n1,0.5,{path}/1.pt\n2,0.25,{path}/2.pt\n")
        np.savez(side / "a.npz", x=np.arange(3.0))
    res = compare_outputs(
        ref,
        tgt,
        [
            CompareRule(file="m.json"),
            CompareRule(file="l.csv"),
            CompareRule(file="a.npz", ignore=("y",)),
        ],
    ).to_dict()
    assert res["within_tolerance"] is True, [f["detail"] for f in res["files"]]
    by = {f["path"]: f for f in res["files"]}
    assert [m["key"] for m in by["m.json"]["metadata_differences"]] == ["out_dir"]
    assert [m["key"] for m in by["l.csv"]["metadata_differences"]] == ["ckpt"]
    strict = compare_outputs(ref, tgt, [CompareRule(file="l.csv", strict=True)]).to_dict()
    assert strict["files"][0]["first_failing_key"] == "ckpt"
