"""``remotemac audit``: real fixture projects, real files on disk, no mocks.

Fixture projects live in tests/fixtures/audit/; anything that depends on
.gitignore is built in tmp_path, because git itself would not commit files a
fixture's .gitignore ignores.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remotemac.checks.audit import audit_project, compile_gitignore, decide
from remotemac.checks.audit_rules import RULES, scan_python, scope
from remotemac.errors import BadInput
from remotemac.frontend.audit import main_audit

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "audit"


def table(path: Path) -> set[tuple[str, int, str, str]]:
    """(file, line, rule, severity) of every finding."""
    return {(f.file, f.line, f.rule, f.severity) for f in audit_project(path).findings}


def py(tmp_path: Path, source: str, name: str = "mod.py") -> set[tuple[int, str, str]]:
    """(line, rule, severity) for one Python file written to disk and audited."""
    (tmp_path / name).write_text(source)
    return {(f.line, f.rule, f.severity) for f in audit_project(tmp_path).findings}


# ------------------------------------------------------------------ fixture projects


def test_pure_pytorch_project_is_portable() -> None:
    report = audit_project(FIXTURES / "pure_torch")
    assert report.findings == []
    assert report.verdict == "portable"
    assert report.files_scanned == 2  # train.py and requirements.txt; README.md not read


def test_cuda_extension_and_flash_attn_are_blockers_at_exact_lines() -> None:
    report = audit_project(FIXTURES / "cuda_ext")
    blockers = {(f.file, f.line, f.rule) for f in report.findings if f.severity == "blocker"}
    assert blockers == {
        ("setup.py", 8, "cuda-extension"),
        ("setup.py", 11, "nvcc"),
        ("setup.py", 15, "flash-attn"),
        ("model.py", 3, "flash-attn"),
        ("requirements.txt", 4, "flash-attn"),
        ("csrc/fused_kernel.cu", 4, "cuda-source"),
        ("csrc/fused.cpp", 3, "cuda-cxx"),
    }
    assert report.verdict == "keep-linux"
    flash = next(f for f in report.findings if f.file == "model.py" and f.line == 3)
    assert flash.text == "from flash_attn import flash_attn_func"
    assert "scaled_dot_product_attention" in flash.alternative


def test_comments_docstrings_and_plain_strings_are_not_findings() -> None:
    lines = {(f, line) for f, line, _, _ in table(FIXTURES / "cuda_ext")}
    # model.py: 1 docstring, 5 comment, 6 log string; setup.py 4 comment;
    # fused.cpp 2 commented-out include
    for quiet in [
        ("model.py", 1),
        ("model.py", 5),
        ("model.py", 6),
        ("setup.py", 4),
        ("csrc/fused.cpp", 2),
    ]:
        assert quiet not in lines
    assert table(FIXTURES / "pure_torch") == set()  # its docstring says .cuda() and "cuda"


def test_prose_about_cuda_in_python_is_silent(tmp_path: Path) -> None:
    source = '''"""Uses torch.device("cuda") and .cuda() when asked."""
# model.cuda(); import flash_attn; torch.cuda.synchronize()
MESSAGE = "moving to cuda"
HELP = {"device": "cuda or mps"}
print("call .cuda() yourself", "cuda")
'''
    assert py(tmp_path, source) == set()


def test_dot_cuda_and_torch_device_cuda_need_refactor() -> None:
    found = table(FIXTURES / "cuda_ext")
    assert ("model.py", 15, "dot-cuda", "needs-refactor") in found
    assert ("model.py", 16, "cuda-device", "needs-refactor") in found


def test_cuda_wheels_and_index_urls_in_requirements() -> None:
    found = {
        (f, line, r, s) for f, line, r, s in table(FIXTURES / "cuda_ext") if f == "requirements.txt"
    }
    assert found == {
        ("requirements.txt", 1, "cuda-index", "needs-refactor"),
        ("requirements.txt", 2, "cu-wheel", "needs-refactor"),
        ("requirements.txt", 3, "nvidia-wheel", "needs-refactor"),
        ("requirements.txt", 4, "flash-attn", "blocker"),
    }


def test_refactor_only_project() -> None:
    report = audit_project(FIXTURES / "refactor_only")
    assert {(f.line, f.rule, f.severity) for f in report.findings} == {
        (4, "cudnn-flag", "note"),
        (5, "cuda-at-import", "needs-refactor"),
        (7, "cuda-device", "needs-refactor"),
        (10, "cuda-device", "needs-refactor"),
        (11, "cuda-device", "needs-refactor"),
        (16, "dot-cuda", "needs-refactor"),
        (17, "cuda-device", "needs-refactor"),
        (18, "capability-check", "needs-refactor"),
        (19, "cuda-amp", "needs-refactor"),
        (21, "cuda-call", "note"),
        (26, "no-mps-branch", "note"),
    }
    assert report.verdict == "refactor-for-portability"


def test_distributed_training_is_dual_track_and_optional_imports_are_notes() -> None:
    report = audit_project(FIXTURES / "dual_track")
    assert {(f.line, f.rule, f.severity) for f in report.findings} == {
        (3, "deepspeed", "blocker"),
        (8, "xformers", "note"),  # inside try/except ImportError
        (14, "nccl", "needs-refactor"),
        (15, "cuda-call", "note"),
    }
    assert report.verdict == "dual-track"


def test_dependency_file_formats() -> None:
    found = table(FIXTURES / "deps_zoo")
    expected = {
        ("pyproject.toml", 7, "bitsandbytes", "blocker"),
        ("pyproject.toml", 8, "nvidia-wheel", "note"),  # sys_platform == "linux" marker
        ("pyproject.toml", 12, "xformers", "note"),  # an optional extra
        ("pyproject.toml", 16, "cuda-index", "needs-refactor"),
        ("environment.yml", 4, "conda-cuda", "needs-refactor"),  # nvidia channel
        ("environment.yml", 9, "conda-cuda", "needs-refactor"),
        ("environment.yml", 10, "conda-cuda", "needs-refactor"),
        ("environment.yml", 13, "deepspeed", "blocker"),
        ("setup.cfg", 8, "apex", "blocker"),
        ("setup.cfg", 12, "vllm", "note"),  # an optional extra
        ("Pipfile", 7, "cupy", "blocker"),
        ("uv.lock", 5, "nvidia-wheel", "note"),
        ("uv.lock", 14, "cu-wheel", "note"),
        ("uv.lock", 15, "cuda-index", "note"),
        ("uv.lock", 22, "cu-wheel", "note"),
        ("CMakeLists.txt", 3, "cmake-cuda", "blocker"),
        ("run.sh", 3, "nvcc", "blocker"),
        ("run.sh", 4, "cuda-env", "note"),
    }
    assert found == expected  # description/keywords (lines 3-4) and comments are silent


# ------------------------------------------------------------------ python rules


def test_python_rules_resolve_aliases_guards_and_build_calls(tmp_path: Path) -> None:
    source = """import subprocess
import torch as th
from torch.utils.cpp_extension import load
from torch.cuda.amp import GradScaler

th.cuda.synchronize()
assert th.cuda.is_available()
kernels = load("k", sources=["k.cpp", "k_kernel.cu"])
subprocess.run(["nvcc", "-O3", "k.cu"])


def run(model, x, rank, use_cuda):
    if use_cuda:
        model.cuda()
    if th.cuda.is_available():
        th.cuda.synchronize()
    y = x.to(f"cuda:{rank}")
    if not th.cuda.is_available():
        raise SystemExit("needs a GPU")
    return model(y)


parser_default = dict(device="cuda")
"""
    assert py(tmp_path, source) == {
        (4, "cuda-amp", "needs-refactor"),
        (6, "cuda-at-import", "needs-refactor"),
        (7, "cuda-required", "needs-refactor"),
        (8, "cuda-extension", "blocker"),
        (9, "nvcc", "blocker"),
        (17, "cuda-device", "needs-refactor"),
        (18, "cuda-required", "needs-refactor"),
        (23, "cuda-device", "needs-refactor"),
    }


def test_guarded_cuda_build_and_argparse_default(tmp_path: Path) -> None:
    source = """import argparse
import torch
from torch.utils.cpp_extension import CUDAExtension

ext = []
if torch.cuda.is_available():
    ext.append(CUDAExtension("x", ["x.cu"]))
p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--name", default="cuda")
"""
    assert py(tmp_path, source) == {
        (7, "cuda-extension", "note"),
        (9, "cuda-device", "needs-refactor"),
    }


def test_setup_py_install_requires_is_read_without_trigger_words(tmp_path: Path) -> None:
    source = 'from setuptools import setup\nsetup(name="x", install_requires=["vllm"])\n'
    assert py(tmp_path, source, "setup.py") == {(2, "vllm", "blocker")}


def test_unparsable_python_is_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "py2.py").write_text("print 'cuda'\n")
    report = audit_project(tmp_path)
    assert report.unparsed == ["py2.py"]
    assert scan_python("py2.py", b"print 'cuda'\n") is None


# ------------------------------------------------------------------ walking the tree


def test_gitignore_patterns() -> None:
    def ignored(patterns: str, rel: str, is_dir: bool = False) -> bool:
        stack = scope.IgnoreStack()
        stack.layers.append(("", compile_gitignore(patterns)))
        return stack.ignored(rel, is_dir)

    assert ignored("build/", "build", is_dir=True)
    assert ignored("build/", "src/build", is_dir=True)
    assert not ignored("build/", "build")  # a file named build is not a directory
    assert ignored("*.pt\n!keep.pt", "a/b/w.pt")
    assert not ignored("*.pt\n!keep.pt", "a/keep.pt")
    assert ignored("/top.py", "top.py")
    assert not ignored("/top.py", "sub/top.py")
    assert ignored("docs/**/*.py", "docs/a/b/c.py")
    assert ignored("docs/**/*.py", "docs/c.py")
    assert not ignored("docs/**/*.py", "src/docs/c.py")
    assert ignored("gen?.py", "x/gen1.py")
    assert not ignored("gen?.py", "x/gen10.py")
    assert ignored("# comment\n\n[ab].py", "b.py")
    assert not ignored("# comment\n\n[ab].py", "c.py")


def test_walk_honours_gitignore_and_skips_tools_envs_binaries(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / ".gitignore").write_text("build/\n*.gen.py\n")
    for rel, text in {
        "build/x.py": "import flash_attn\n",
        "a.gen.py": "import flash_attn\n",
        "src/.gitignore": "local_*.py\n!local_keep.py\n",
        "src/local_x.py": "import flash_attn\n",
        "src/local_keep.py": "import flash_attn\n",
        ".git/hooks/h.py": "import flash_attn\n",
        ".venv/pyvenv.cfg": "home = /usr\n",
        ".venv/lib/t.py": "import flash_attn\n",
        "env2/conda-meta/history": "\n",
        "env2/t.py": "import flash_attn\n",
        "big.py": "import flash_attn\n" + "x = 1\n" * 50,
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "bin.py").write_bytes(b"import flash_attn\n\0\0")
    monkeypatch.setattr(scope, "MAX_SOURCE_BYTES", 200)
    report = audit_project(tmp_path)
    assert {f.file for f in report.findings} == {"src/local_keep.py"}
    assert report.skipped["gitignored"] == 3  # build/, a.gen.py, src/local_x.py
    assert report.skipped["environment"] == 2
    assert report.skipped["tool-dir"] == 1
    assert report.skipped["binary"] == 1
    assert report.skipped["huge"] == 1


def test_this_repository_has_no_blockers_in_its_own_code() -> None:
    """Our rule tables are full of "cuda" strings: none of them may be a finding, and the
    test fixtures' blockers are set apart instead of deciding the verdict (issue 18)."""
    report = audit_project(REPO)
    assert report.files_scanned > 20
    assert [f for f in report.findings if f.severity == "blocker"] == []
    assert not [f for f in report.findings if f.file.startswith("remotemac/checks/audit")]
    fixture_blockers = {(f.file, f.line) for f in report.set_apart if f.severity == "blocker"}
    assert ("tests/fixtures/audit/cuda_ext/model.py", 3) in fixture_blockers
    assert {f.zone for f in report.set_apart} >= {"fixtures"}
    assert report.verdict != "keep-linux"


# ------------------------------------------------------------------ verdict and output


def test_decision_rules_order() -> None:
    def f(rule: str, severity: str | None = None):
        from remotemac.checks.audit_rules import make

        return make(rule, "x.py", 1, "x", severity=severity)

    assert decide([]) == (
        "portable",
        ["Run it on a Mac as it is: nothing ties this project to CUDA."],
    )
    assert decide([f("cudnn-flag")])[0] == "portable"
    assert decide([f("dot-cuda"), f("cudnn-flag")])[0] == "refactor-for-portability"
    assert decide([f("nccl"), f("dot-cuda")])[0] == "dual-track"
    assert decide([f("apex"), f("dot-cuda")])[0] == "dual-track"
    assert decide([f("apex"), f("flash-attn")])[0] == "keep-linux"
    assert decide([f("flash-attn", "note")])[0] == "portable"  # optional import only
    assert all(r.severity in ("blocker", "needs-refactor", "note") for r in RULES.values())


def test_main_audit_json(tmp_path: Path) -> None:
    from rich.console import Console

    buf = io.StringIO()
    code = main_audit(FIXTURES / "cuda_ext", as_json=True, console=Console(file=buf))
    assert code == 0
    data = json.loads(buf.getvalue())
    assert {"path", "files_scanned", "elapsed_s", "findings", "verdict", "summary"} <= set(data)
    assert data["verdict"] == "keep-linux"
    assert data["files_scanned"] == 5
    assert set(data["findings"][0]) == {
        "file",
        "line",
        "text",
        "severity",
        "why",
        "alternative",
        "rule",
        "cell",
        "zone",
    }
    assert data["elapsed_s"] >= 0


def test_main_audit_table_names_findings_and_verdict() -> None:
    from rich.console import Console

    buf = io.StringIO()
    assert (
        main_audit(FIXTURES / "cuda_ext", as_json=False, console=Console(file=buf, width=200)) == 0
    )
    out = buf.getvalue()
    assert "model.py:3" in out and "keep-linux" in out and "blocker" in out
    assert re.search(r" in \d+\.\d\ds;", out), out  # elapsed time, number and unit as one


def test_missing_path_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as err:
        main_audit(tmp_path / "nope", as_json=False)
    assert err.value.exit_code == 2
    assert "\n" not in err.value.line() and "does not exist" in err.value.line()


def test_import_stays_light() -> None:
    """The CLI imports this module at start: no rich, never torch."""
    code = (
        "import sys; import remotemac.checks.audit; "
        "print('rich' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "False"]


# ------------------------------------------------------------------ speed


def _bench_module():
    spec = importlib.util.spec_from_file_location(
        "bench_audit", REPO / "scripts" / "bench_audit.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_generated_tree_is_walked_completely_and_fast(tmp_path: Path) -> None:
    bench = _bench_module()
    expected = bench.generate_tree(tmp_path, 2000)
    start = time.perf_counter()
    report = audit_project(tmp_path)
    elapsed = time.perf_counter() - start
    assert report.files_seen == expected
    assert report.skipped["gitignored"] == 1  # the build/ directory, not entered
    assert not [f for f in report.findings if f.file.startswith("build/")]
    assert elapsed < 10, f"2,000 files took {elapsed:.1f} s"


def test_statement_pruning_never_changes_findings() -> None:
    """The trigger-line pruning is only for speed: a full visit finds the same."""
    from remotemac.checks.audit_rules import PythonScanner

    files = [p for p in FIXTURES.rglob("*.py") if p.name != "setup.py"]
    assert len(files) >= 4
    for path in files:
        data = path.read_bytes()
        full = PythonScanner(path.name, data, None).run(__import__("ast").parse(data))
        assert scan_python(path.name, data) == full, path


def test_single_file_and_unreadable_kinds(tmp_path: Path) -> None:
    report = audit_project(FIXTURES / "cuda_ext" / "model.py")
    assert {(f.file, f.line, f.rule) for f in report.findings} == {
        ("model.py", 3, "flash-attn"),
        ("model.py", 15, "dot-cuda"),
        ("model.py", 16, "cuda-device"),
    }
    (tmp_path / "notes.md").write_text("cuda\n")
    with pytest.raises(BadInput):
        audit_project(tmp_path / "notes.md")


def test_syntax_warnings_do_not_leak(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text('import torch\nPAT = "\\d+"\nx = torch.zeros(1).cuda()\n')
    code = (
        "import warnings; warnings.simplefilter('error'); from pathlib import Path; "
        "from remotemac.checks.audit import audit_project; "
        f"print(len(audit_project(Path({str(tmp_path)!r})).findings))"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1" and out.stderr == ""


def test_negative_comparisons_and_flags_are_not_cuda_requirements(tmp_path: Path) -> None:
    source = """import torch


def f(x, arch, dtypesIfCUDA):
    assert x.device.type != "cuda" or arch >= 90
    if not isinstance(dtypesIfCUDA, tuple):
        raise TypeError("bad")
    if x.device.type != "cuda":
        x = x.cuda()
    assert x.device.type == "cuda"
"""
    assert py(tmp_path, source) == {
        (9, "dot-cuda", "needs-refactor"),
        (10, "cuda-required", "needs-refactor"),
    }
