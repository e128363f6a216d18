"""MPS support prediction from the installed torch's native_functions.yaml."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from remotemac.checks import mps_coverage
from remotemac.checks.mps_coverage import (
    ALWAYS_FALLBACK,
    DEVICE_VARIANTS,
    OpTable,
    dtype_issues,
    load_table,
    parse_entries,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table() -> OpTable:
    return load_table()


@pytest.mark.parametrize("op", ["add.Tensor", "mm", "gelu", "cat", "sum", "aten::add.Tensor"])
def test_common_ops_are_supported(table: OpTable, op: str) -> None:
    """These have only sparse/nested keys of their own: the delegate must be followed."""
    assert table.support(op).covered, table.support(op)


def test_structured_delegate_is_where_the_mps_kernel_is(table: OpTable) -> None:
    support = table.support("add.Tensor")
    assert (support.kind, support.via) == ("mps", "add.out")
    assert "MPS" not in table.entries["add.Tensor"].keys
    assert "MPS" in table.entries["add.out"].keys


def test_linalg_svd_is_always_fallback(table: OpTable) -> None:
    assert table.support("linalg_svd").kind == "fallback"
    assert table.support("aten::linalg_svd.U").kind == "fallback"


def test_ops_without_mps_kernel_are_missing(table: OpTable) -> None:
    assert table.support("aten::linalg_eig").kind == "missing"
    assert table.support("_linalg_svd").kind == "missing"


def test_cpu_attention_variant_maps_to_the_mps_path(table: OpTable) -> None:
    fwd = table.support("aten::_scaled_dot_product_flash_attention_for_cpu")
    bwd = table.support("aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    assert (fwd.kind, fwd.via) == ("mapped", "_scaled_dot_product_attention_math_for_mps")
    assert bwd.kind == "mapped"


def test_every_device_variant_target_exists_in_this_torch(table: OpTable) -> None:
    """A renamed MPS op in a new torch must break this test, not silently cry wolf."""
    for cpu_op, mps_op in DEVICE_VARIANTS.items():
        assert cpu_op in table.entries, cpu_op
        assert table._kernel(mps_op).covered, (cpu_op, mps_op)


def test_other_namespaces(table: OpTable) -> None:
    assert table.support("profiler::_record_function_enter_new").kind == "agnostic"
    assert table.support("torchvision::nms").kind == "unknown"
    assert table.support("aten::no_such_op_here").kind == "unknown"


SYNTHETIC = textwrap.dedent(
    """
    - func: both(Tensor self) -> Tensor
      dispatch:
        CPU, CUDA, MPS: both_kernel
    - func: cpu_only(Tensor self) -> Tensor
      dispatch:
        CPU, CUDA: cpu_only
    - func: implicit(Tensor self) -> Tensor
      variants: function
    - func: explicit(Tensor self) -> Tensor
      dispatch:
        CompositeExplicitAutograd: explicit
    - func: delegated(Tensor self) -> Tensor
      structured_delegate: delegated.out
      dispatch:
        SparseCPU, SparseMPS: delegated_sparse
    - func: delegated.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
      structured: True
      dispatch:
        CPU, MPS: delegated_out
    - func: cpu_delegated(Tensor self) -> Tensor
      structured_delegate: cpu_delegated.out
    - func: cpu_delegated.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
      dispatch:
        CPU: x
    - func: col2im(Tensor self) -> Tensor
      dispatch:
        CPU, MPS: col2im
    - func: embedding_renorm_(Tensor(a!) self) -> Tensor(a!)
      dispatch:
        CPU: r
    """
)


def test_rules_on_a_synthetic_yaml() -> None:
    synthetic = OpTable(parse_entries(yaml.safe_load(SYNTHETIC)))
    kinds = {name: synthetic.support(name).kind for name in synthetic.entries}
    assert kinds == {
        "both": "mps",  # combined key list is split
        "cpu_only": "missing",
        "implicit": "composite",  # no dispatch section
        "explicit": "composite",
        "delegated": "mps",  # own keys are sparse only: the delegate decides
        "delegated.out": "mps",
        "cpu_delegated": "missing",
        "cpu_delegated.out": "missing",
        "col2im": "mps",  # on the fallback list, but this torch has a kernel: trust the yaml
        "embedding_renorm_": "fallback",
    }


def test_always_fallback_list_matches_mps_facts() -> None:
    assert {"embedding_renorm_", "linalg_svd", "linalg_svd.U"} <= ALWAYS_FALLBACK


@pytest.mark.parametrize(
    ("op", "dtypes", "expected"),
    [
        ("aten::mm", ["float32"], []),
        ("aten::add.Tensor", ["float32", "int64"], []),
        ("aten::mm", ["float64"], [("fail", "float64")]),
        ("aten::_to_copy", ["float32", "float64"], [("fail", "float64")]),
        ("aten::mul.Tensor", ["complex128"], [("fail", "complex128")]),
        ("aten::mul.Tensor", ["complex64"], []),
        ("aten::convolution", ["int64"], [("fail", "int64 convolution")]),
        ("aten::scatter_reduce.two", ["int64"], [("caveat", "int64 scatter_reduce")]),
    ],
)
def test_dtype_rules(op: str, dtypes: list[str], expected: list[tuple[str, str]]) -> None:
    issues = dtype_issues(op, dtypes)
    assert [
        (i.verdict, i.reason.split(":")[0].replace(" unsupported on MPS", "")) for i in issues
    ] == expected


def test_table_is_cached_and_finding_it_does_not_import_torch() -> None:
    assert load_table() is load_table()
    code = (
        "import sys\n"
        "from remotemac.checks.mps_coverage import load_table, torch_version\n"
        "t = load_table()\n"
        "assert len(t) > 2000, len(t)\n"
        "assert torch_version()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_yaml_path_is_the_installed_torchs() -> None:
    path = mps_coverage.native_functions_path()
    assert path.name == "native_functions.yaml"
    assert path.parts[-5:-1] == ("torchgen", "packaged", "ATen", "native")
