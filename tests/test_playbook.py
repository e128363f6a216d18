"""Playbook validation through the real CLI: exit 2, one line per problem, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remotemac.playbook import PlaybookErrors, check_remote_root, parse_playbook
from tests.conftest import REPO, remotemac, remotemac_in_process

GOOD = "name: ok\nworkload:\n  command: python t.py --device {device}\n"

# (label, text, key path expected in the message, line expected)
BROKEN = [
    ("bad yaml", "name: a\nworkload: [\n", "bad YAML", 3),
    ("unknown key", "name: a\nworkload:\n  command: x\n  comand: y\n", "workload.comand", 4),
    ("unknown top key", "name: a\nworkload: {command: x}\nouputs: {}\n", "ouputs", 3),
    (
        "wrong type",
        "name: a\nworkload: {command: x}\ncost:\n  hourly_rate: lots\n",
        "cost.hourly_rate",
        4,
    ),
    (
        "bad size",
        "name: a\nworkload: {command: x}\ndata:\n  path: d\n  classification: public\n"
        "  max_bytes: 2XB\n",
        "data.max_bytes",
        6,
    ),
    (
        "negative timeout",
        "name: a\nworkload:\n  command: x\n  timeout: -3\n",
        "workload.timeout",
        4,
    ),
    ("missing command", "name: a\nworkload:\n  target: {device: mps}\n", "workload.command", 3),
    (
        "encrypt false on sensitive",
        "name: a\nworkload: {command: x}\ndata:\n  path: d\n"
        "  classification: sensitive\n  approved_for_remote: true\n  encrypt: false\n",
        "data",
        4,
    ),
    (
        "sensitive not approved",
        "name: a\nworkload: {command: x}\ndata:\n  path: d\n  classification: sensitive\n",
        "data",
        4,
    ),
    (
        "bad device",
        "name: a\nworkload:\n  command: x\n  target: {device: tpu}\n",
        "workload.target.device",
        4,
    ),
    (
        "bad placeholder",
        "name: a\nworkload:\n  command: 'python t.py {dev}'\n",
        "workload.command",
        3,
    ),
    (
        "remote_root is home",
        "name: a\nremote_root: '~'\nworkload: {command: x}\n",
        "remote_root",
        2,
    ),
    (
        "remote_root system dir",
        "name: a\nremote_root: /usr\nworkload: {command: x}\n",
        "remote_root",
        2,
    ),
    (
        "negative rtol",
        "name: a\nworkload: {command: x}\noutputs:\n  compare:\n    - {file: m.json, rtol: -1}\n",
        "outputs.compare.0.rtol",
        5,
    ),
    ("bad wipe", "name: a\nworkload: {command: x}\nwipe: sometimes\n", "wipe", 3),
    ("missing name", "workload: {command: x}\n", "name", 1),
    ("not a mapping", "- just\n- a list\n", "mapping", 1),
]


@pytest.mark.parametrize("label,text,key,line", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_playbooks_fail_in_one_line(tmp_path: Path, label, text, key, line):
    path = tmp_path / "pb.yaml"
    path.write_text(text)
    proc = remotemac_in_process("check", str(path))  # test_missing_file_*: a real process
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) >= 1
    hit = [x for x in lines if key in x and f"pb.yaml:{line}:" in x]
    assert hit, f"no line names {key!r} at line {line}: {lines}"


def test_did_you_mean():
    with pytest.raises(PlaybookErrors) as err:
        parse_playbook("name: a\nworkload:\n  command: x\n  timeuot: 2h\n", "p.yaml")
    assert "did you mean 'timeout'" in err.value.line()


def test_on_is_a_key_not_a_boolean():
    pb = parse_playbook("name: a\nworkload:\n  command: x\n  reference: {device: cpu, on: local}\n")
    assert pb.workload.reference.on == "local"


def test_defaults_and_units():
    pb = parse_playbook(GOOD + "data:\n  path: d\n  max_bytes: 2GiB\n  classification: public\n")
    assert pb.host == "local" and pb.remote_root == "~/remotemac"
    assert pb.data.max_bytes == 2 * 1024**3
    assert pb.workload.timeout == 7200
    assert pb.workload.target.device == "mps" and pb.workload.reference.device == "cpu"
    assert pb.data.encrypt is True and pb.wipe == "after_pull"


def test_spec_example_playbook_is_valid():
    """The playbook printed in the README (and docs/contract.md) validates as is."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    pb = parse_playbook(block)
    assert pb.data.sample.files == 200
    assert pb.outputs.compare[1].file == "preds/*.pt"


@pytest.mark.parametrize("root", ["/", "~", "", "/etc", "/Users", "~/../x", "relative/dir"])
def test_remote_root_refused(root):
    with pytest.raises(ValueError):
        check_remote_root(root)


def test_check_good_and_schema(tmp_path: Path):
    path = tmp_path / "pb.yaml"
    path.write_text(GOOD)
    assert remotemac("check", str(path)).returncode == 0
    proc = remotemac("schema")
    schema = json.loads(proc.stdout)
    assert "workload" in schema["properties"] and "workload" in schema["required"]
    assert schema["additionalProperties"] is False


def test_quickstart_is_valid():
    assert remotemac("check", str(REPO / "playbooks" / "quickstart.yaml")).returncode == 0


def test_missing_file_is_bad_input(tmp_path: Path):
    proc = remotemac("check", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "no such playbook" in proc.stderr


def test_a_name_with_spaces_says_what_a_name_may_hold():
    """`name: My MLP test` answered "String should match pattern
    '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'": a regex, where a user needs words."""
    with pytest.raises(PlaybookErrors) as err:
        parse_playbook("name: My MLP test\nworkload: {command: python t.py}\n")
    line = str(err.value)
    assert "pattern" not in line and "^[" not in line, line
    assert "letters, digits" in line and "'My MLP test'" in line, line
