"""One placeholder syntax for a workload's command, the same under ``run`` and ``preflight``.

Real files and real processes: preflight runs the command's script under the tracer and
the script writes the argv it received; ``run``'s side is the launch request the agent
gets (engine/jobs.job_request), which tmux runs as written.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from remotemac.checks.preflight import run_preflight
from remotemac.engine.context import fill_matrix, make_sides
from remotemac.engine.jobs import job_request
from remotemac.engine.phaseresults import ProvisionHost
from remotemac.errors import BadInput
from remotemac.placeholders import expand
from remotemac.playbook import parse_playbook

ARGV_SCRIPT = (
    "import json, sys, torch\n"
    "torch.ones(1) + 1\n"
    "open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))\n"
)


def _playbook(command: str):  # noqa: ANN202
    text = f"name: braces\nworkload:\n  command: {json.dumps(command)}\n"
    return parse_playbook(text)


def _run_command(command: str) -> str:
    """The command ``run`` hands the agent for the target side."""
    pb = _playbook(command)
    ctx = SimpleNamespace(playbook=pb, run_id="r1", results={}, result=lambda phase: None)
    side = make_sides(pb)[-1]
    side.label = "mps"
    prov = ProvisionHost(run_dir="/rr/runs/r1", venv_python="/rr/envs/e/bin/python")
    request = job_request(ctx, side, "mps", prov, "/rr/data")  # type: ignore[arg-type]
    mkdir, _, command = request.command.partition(" && ")
    assert mkdir == "mkdir -p /rr/runs/r1/out/mps"
    return command


def _preflight_argv(tmp_path: Path, command: str) -> list[str]:
    (tmp_path / "argv.py").write_text(ARGV_SCRIPT, encoding="utf-8")
    got = tmp_path / "got.json"
    report = run_preflight(f"python argv.py {got} {command}", tmp_path, None, 30, {})
    assert report.workload_error is None, report.output_tail
    return json.loads(got.read_text(encoding="utf-8"))


def test_double_braces_reach_the_job_as_single_braces_under_run_and_preflight(
    tmp_path: Path,
) -> None:
    """Was ``{x}`` under run but ``{{x}}`` under preflight (and ``{{device}}`` was
    ``{cpu}`` there)."""
    args = "--fmt {{x}} --tag {{device}} --dev {device}"
    assert _preflight_argv(tmp_path, args) == ["--fmt", "{x}", "--tag", "{device}", "--dev", "cpu"]
    assert _run_command("python t.py " + args) == "python t.py --fmt {x} --tag {device} --dev mps"


def test_a_dict_literal_in_a_command_is_accepted_and_reaches_the_job_as_written(
    tmp_path: Path,
) -> None:
    """``{'a': 1}`` cannot be a placeholder: was refused as "unknown placeholder {'a'}"."""
    code = "d={'a': 1}; print(d['a'], {**d})"
    command = f'python -c "{code}" --out {{output_dir}}'
    _playbook(command)  # accepted by the playbook's own check
    assert _run_command(command) == f'python -c "{code}" --out /rr/runs/r1/out/mps'
    got = _preflight_argv(tmp_path, shlex.quote(code) + " '${HOME}' '{}' {a,b}")
    assert got == [code, "${HOME}", "{}", "{a,b}"]


def test_an_unknown_name_in_braces_is_an_error_with_the_escape_hint() -> None:
    with pytest.raises(BadInput) as err:
        _playbook("python -c 'print({devcie})' {device}")
    line = err.value.line()
    assert "unknown placeholder {devcie}" in line and "did you mean {device}" in line, line
    assert "{{devcie}}" in line, line  # the hint says how to write the brace itself


def test_preflight_refuses_an_unknown_placeholder_as_run_does(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"unknown placeholder \{dta_dir\}.*\{\{dta_dir\}\}"):
        run_preflight("python t.py {dta_dir}", tmp_path, None, 5, {})


def test_a_matrix_value_with_braces_stays_literal_through_both_passes() -> None:
    cmd = "python3 t.py --dtype {matrix.dtype} --out {output_dir} -c \"{'k': 1}\" '{{}}'"
    filled = fill_matrix(cmd, {"dtype": "it's {odd}"})
    assert expand(filled, {"output_dir": "/o d"}) == (
        "python3 t.py --dtype 'it'\"'\"'s {odd}' --out '/o d' -c \"{'k': 1}\" '{}'"
    )


def test_a_nested_dict_keeps_its_closing_braces() -> None:
    """``}}`` is one brace only when it closes a ``{{``: the end of a nested dict is the
    command's own."""
    code = "python -c \"print({'a': {'b': 1}})\" --out {output_dir} '{{}}' echo }}"
    want = "python -c \"print({'a': {'b': 1}})\" --out /o '{}' echo }}"
    assert expand(code, {"output_dir": "/o"}) == want
    assert expand(fill_matrix(code, {}), {"output_dir": "/o"}) == want
    assert _run_command(code.replace("{output_dir}", "x")) == want.replace("/o", "x")
