"""Issue 34: every checkpoint a rule matches is compared, or honestly not.

Real torch throughout, on small reproductions of public training code written here:
``wordlm`` is PyTorch's examples/word_language_model (``torch.save(model)``: a pickle
of ``model.RNNModel``), the vision checkpoint is shaped like an ImageNet trainer's
``last.pth.tar`` (``{'epoch', 'state_dict', 'optimizer', 'args': argparse.Namespace}``)
with logits from ``torch.autocast('cpu', dtype=torch.bfloat16)``. The host's converter
runs as the runner runs it (``runner.convert_checkpoints``: the workload's interpreter
in the job's directory), here on this machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remotemac.acceptance.compare import CONVERTED_DIR, compare_outputs
from remotemac.acceptance.record import build_record, write_record
from remotemac.agent import ckptconvert, runner
from remotemac.playbook import CompareRule, PlaybookErrors, load_playbook
from tests.conftest import REPO

WORDLM = REPO / "tests" / "fixtures" / "projects" / "wordlm"
MiB = 1 << 20


def _passing_observations(results: dict) -> dict:
    return {
        "tensors_on_device": True,
        "operators": {"fallback_ops": [], "unsupported_ops": [], "dtype_errors": []},
        "memory": {"peak_bytes": 300 * MiB, "stable": True, "slope_bytes_per_s": 0.0},
        "results": results,
    }


def _record(results: dict, tmp_path: Path) -> tuple[dict, str]:
    rec = build_record(
        run_id="r1",
        observations=_passing_observations(results),
        context={"goal": "inference", "target_device": "mps"},
    )
    write_record(tmp_path / "rec", rec)
    raw_json = (tmp_path / "rec" / "acceptance.json").read_text()
    md = (tmp_path / "rec" / "acceptance.md").read_text()
    assert "\x1b" not in raw_json and "\x1b" not in md  # no raw terminal control byte
    return json.loads(raw_json), md


@pytest.fixture(scope="module")
def wordlm(tmp_path_factory, workload_python: str) -> dict[str, Path]:
    """Three runs of the word-language-model example: two alike, one with another seed;
    in the venv the host built, as its job would run."""
    root = tmp_path_factory.mktemp("wordlm")
    runs = {"ref": 1111, "same": 1111, "other": 2222}
    procs = {
        name: subprocess.Popen(
            [
                workload_python,
                "main.py",
                "--seed",
                str(seed),
                "--save",
                str(root / name / "model.pt"),
            ],
            cwd=WORDLM,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for name, seed in runs.items()
    }
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (name, err.decode()[-2000:])
    return {name: root / name for name in runs}


RULE = [CompareRule(file="model.pt")]


@pytest.mark.slow  # three runs of the example (the module fixture)
def test_whole_model_files_byte_identical_are_accepted_without_loading(wordlm, tmp_path):
    """What issue 34 saw: the two files were byte-identical, yet REJECTED
    'results_outside_tolerance' with linux-gpu-first. Identical bytes pass unloaded."""
    res = compare_outputs(wordlm["ref"], wordlm["same"], RULE)
    (f,) = res.files
    assert f.identical and f.ok and f.detail == "byte-identical: passed without loading"
    rec, _ = _record(res.to_dict(), tmp_path)
    assert rec["verdict"] == "accepted"


@pytest.mark.slow  # three runs of the example (the module fixture)
def test_whole_model_not_converted_is_not_compared_incomplete_naming_the_class(wordlm, tmp_path):
    """The safe loader refuses ``model.RNNModel``: "not compared", the cause named in
    full (not cut before it), the verdict incomplete, no hardware recommendation."""
    res = compare_outputs(wordlm["ref"], wordlm["other"], RULE)
    (f,) = res.files
    assert res.within_tolerance is None and f.ok is None
    assert f.detail.startswith("not compared: reference: cannot load")
    assert "model.RNNModel" in f.detail and "\x1b" not in f.detail
    rec, md = _record(res.to_dict(), tmp_path)
    assert rec["verdict"] == "incomplete"
    assert rec["missing_observations"] == ["results"]
    assert rec["decision"]["recommendation"] is None
    assert not any(c["code"] == "results_outside_tolerance" for c in rec["stopping_conditions"])
    assert "model.RNNModel" in md and "not compared" in md


@pytest.mark.slow  # three runs of the example (the module fixture)
def test_whole_model_converted_on_the_host_is_compared_as_tensors(
    wordlm, tmp_path, monkeypatch, workload_python
):
    """The runner's converter, under the workload's interpreter in the job's directory
    (the venv the host built: conftest's ``workload_python``), writes each side's
    state_dict; the laptop compares those with weights_only=True only (a real
    difference: another seed, named by key), and the record says what was converted."""
    for side in ("ref", "other"):
        got = runner.convert_checkpoints(
            runner.JobSpec.from_json(
                {
                    "convert": {
                        "python": workload_python,
                        "dir": str(wordlm[side]),
                        "patterns": ["*.pt"],
                    },
                    "cwd": str(WORDLM),
                }
            ),
            {"PATH": "/usr/bin:/bin"},
        )
        assert got["converted"] == ["model.pt"], got
        manifest = json.loads((wordlm[side] / CONVERTED_DIR / "manifest.json").read_text())
        assert "whole model model.RNNModel" in manifest["files"]["model.pt"]["what"]
    real_load = torch.load

    def safe_only(*args, **kwargs):
        assert kwargs.get("weights_only") is True, "the laptop unpickled beyond the safe loader"
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", safe_only)
    res = compare_outputs(wordlm["ref"], wordlm["other"], RULE)
    (f,) = res.files
    assert f.converted and "model.RNNModel" in f.converted
    assert f.ok is False and res.within_tolerance is False  # compared: the seeds differ
    assert f.first_failing_key == "encoder.weight"
    assert {t.key for t in f.tensors} >= {"encoder.weight", "decoder.bias", "rnn.weight_ih_l0"}
    # the converted copies are the host's, never outputs of their own
    assert [x.path for x in res.files] == ["model.pt"]


def _vision_checkpoint(path: Path, out_dir: str, shift: float = 0.0) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(10)
    )
    x = torch.randn(2, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    logits.float().sum().backward()
    opt.step()
    with torch.no_grad():
        model[0].bias.add_(shift)
    args = argparse.Namespace(arch="smallnet", lr=0.1, epochs=1, output=out_dir, amp=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "epoch": 1,
            "arch": "smallnet",
            "state_dict": model.state_dict(),
            "optimizer": opt.state_dict(),
            "args": args,
            "logits": logits.detach(),
        },
        path,
    )


@pytest.mark.parametrize("name", ["last.pth.tar", "checkpoint.tar"])
def test_pth_tar_checkpoint_with_args_reads_like_pt_under_safe_globals(tmp_path, name):
    """``last.pth.tar`` was 'unsupported file type .tar'; renamed to .pth it failed on
    argparse.Namespace. It is a torch.save zip like any .pt: read, with the rule's
    safe_globals allowing the Namespace; args.output differs, as metadata."""
    ref, tgt = tmp_path / "cpu", tmp_path / "mps"
    _vision_checkpoint(ref / name, "/runs/cpu")
    _vision_checkpoint(tgt / name, "/runs/mps", shift=1e-7)
    (plain,) = compare_outputs(ref, tgt, [CompareRule(file=name)]).files
    assert plain.ok is None and "argparse.Namespace" in plain.not_compared
    res = compare_outputs(ref, tgt, [CompareRule(file=name, safe_globals=["argparse.Namespace"])])
    (f,) = res.files
    assert res.within_tolerance is True, f.detail
    keys = {t.key: t for t in f.tensors}
    assert keys["logits"].dtype == "bfloat16" and keys["logits"].rtol == 1e-1
    assert keys["state_dict.0.bias"].ok and keys["epoch"].ok
    assert [m.key for m in f.metadata_differences] == ["args.output"]


@pytest.mark.slow  # three runs of the example (the module fixture)
def test_safe_globals_never_imports_the_projects_code(tmp_path, wordlm):
    """Allowing ``model.RNNModel`` would import (run) the project's model.py here."""
    res = compare_outputs(
        wordlm["ref"],
        wordlm["other"],
        [CompareRule(file="model.pt", safe_globals=["model.RNNModel"])],
    )
    (f,) = res.files
    assert f.ok is None and "not from the standard library, torch or numpy" in f.not_compared
    assert "model" not in sys.modules or not hasattr(sys.modules["model"], "RNNModel")


def test_safe_globals_must_be_dotted_class_names(tmp_path):
    pb = tmp_path / "p.yaml"
    pb.write_text(
        "name: p\nhost: local\nworkload: {command: 'true'}\n"
        "outputs: {compare: [{file: a.pt, safe_globals: ['Namespace']}]}\n"
    )
    with pytest.raises(PlaybookErrors) as err:
        load_playbook(pb)
    assert "not a dotted class name like argparse.Namespace" in "\n".join(err.value.lines)


def test_a_rule_that_matches_no_file_leaves_the_verdict_incomplete(tmp_path):
    ref, tgt = tmp_path / "cpu", tmp_path / "mps"
    for side in (ref, tgt):
        side.mkdir()
        (side / "metrics.json").write_text('{"loss": 1.0}')
    res = compare_outputs(ref, tgt, [CompareRule(file="metrics.json"), CompareRule(file="*.pt")])
    assert res.within_tolerance is None
    rec, md = _record(res.to_dict(), tmp_path)
    assert rec["verdict"] == "incomplete" and rec["decision"]["recommendation"] is None
    assert "no file matches '*.pt'" in md


def test_control_bytes_from_a_checkpoint_never_reach_the_record(tmp_path):
    """A host-made file whose string values carry terminal controls (clear screen,
    OSC 52 to the clipboard): shown escaped in acceptance.json and acceptance.md."""
    ref, tgt = tmp_path / "cpu", tmp_path / "mps"
    for side, note in ((ref, "ok"), (tgt, "\x1b[2J\x1b]52;c;cHduZWQ=\x07gone")):
        side.mkdir()
        (side / "m.json").write_text(json.dumps({"loss": 1.0, "note": note}))
    res = compare_outputs(ref, tgt, [CompareRule(file="m.json", strict=True)])
    rec, md = _record(res.to_dict(), tmp_path)
    assert "\\x1b[2J" in md


def _convert_without_an_interpreter(out_dir: Path) -> dict:
    """The runner's converter step over ``out_dir`` with an interpreter that cannot
    start: its answer has an ``error`` exactly when the runner tried to start it."""
    spec = runner.JobSpec.from_json(
        {"convert": {"python": str(out_dir / "no-such-python"), "dir": str(out_dir)}}
    )
    return runner.convert_checkpoints(spec, {"PATH": "/usr/bin:/bin"})


def _plain_checkpoints() -> dict[str, object]:
    """What torch.save writes for a state_dict, an optimizer's state, tensors of each
    storage type and a dict of numbers, strings and tuples: the safe loader reads all."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(net[2].parameters(), betas=(0.9, 0.95))
    net[2](torch.randn(3, 4)).sum().backward()
    opt.step()
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64]
    dtypes += [torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
    dtypes += [torch.complex64, torch.complex128]
    return {
        "state_dict.pt": net.state_dict(),
        "ckpt.pt": {
            "model": net.state_dict(),
            "optimizer": opt.state_dict(),
            "iter_num": 3,
            "best_val_loss": 1.5,
            "config": {"name": "gpt", "bias": False, "dropout": None, "shape": (2, 3)},
            "big": 2**70,
        },
        "dtypes.pth": {str(d): torch.ones(3, dtype=d) for d in dtypes},
        "params.ckpt": [torch.nn.Parameter(torch.randn(2)), torch.arange(6).view(2, 3)[:, 1]],
    }


def test_plain_checkpoints_are_read_as_they_are_and_no_converter_starts(tmp_path):
    """A state_dict (mnist's ``mnist_cnn.pt``) and the like need no converter: the host
    tells so from the pickle's opcodes without torch, and the runner starts no
    interpreter (before, it imported torch only to find that out: 2-3 s after each
    side's job). Each file said plain is one the safe loader does read."""
    for name, obj in _plain_checkpoints().items():
        torch.save(obj, tmp_path / name)
        assert ckptconvert.reads_safely_as_is(str(tmp_path / name)), name
        torch.load(tmp_path / name, weights_only=True)  # the laptop's loader agrees
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert _convert_without_an_interpreter(tmp_path) == {"converted": [], "failed": {}}


def _refused_or_unsure(tmp_path: Path) -> dict[str, Path]:
    """Files the host must not call plain: the safe loader refuses some (a whole model,
    argparse.Namespace, a set, bytes), the rest are not torch.save's plain zip at
    protocol 2 (legacy format, protocol 4, not a zip, cut short)."""
    made: dict[str, Path] = {}
    tmp_path.mkdir()

    def save(name: str, obj: object, **kwargs) -> None:
        made[name] = tmp_path / name
        torch.save(obj, made[name], **kwargs)

    save("model.pt", torch.nn.Linear(2, 2))
    _vision_checkpoint(tmp_path / "last.pth.tar", "/runs/cpu")
    made["last.pth.tar"] = tmp_path / "last.pth.tar"
    save("set.pt", {"seen": {1, 2}})
    save("bytes.pt", {"blob": b"\x00\x01"})
    save("legacy.pt", {"w": torch.ones(2)}, _use_new_zipfile_serialization=False)
    save("proto4.pt", {"w": torch.ones(2)}, pickle_protocol=4)
    made["text.pt"] = tmp_path / "text.pt"
    made["text.pt"].write_text("not a checkpoint")
    whole = (tmp_path / "set.pt").read_bytes()
    made["cut.pt"] = tmp_path / "cut.pt"
    made["cut.pt"].write_bytes(whole[: len(whole) // 2])
    return made


def test_a_checkpoint_the_safe_loader_may_refuse_still_goes_to_the_converter(tmp_path):
    """Only a sure "plain" skips the converter: each of these is left to it (the
    runner does try to start the workload's interpreter), alone in its dir."""
    for name, path in _refused_or_unsure(tmp_path / "made").items():
        assert not ckptconvert.reads_safely_as_is(str(path)), name
        alone = tmp_path / name
        alone.mkdir()
        path.rename(alone / name)
        got = _convert_without_an_interpreter(alone)
        assert "error" in got and got["converted"] == [], (name, got)
