"""Issue 15: property tests (Hypothesis) for playbook validation, remote names and redaction.

The same properties drive ``scripts/fuzz_playbook.py`` (10,000 examples and more);
here they run with a few hundred, derandomised, so CI is quick and never flaky.

* playbook: any YAML (random trees, valid playbooks with random values in random
  places, raw text) through the real CLI (``run --dry-run --json``): exit 0 with
  a plan, or exit 2 with one line per problem; never an internal error.
* remote names: any bytes (or str) a host may send: a safe relative path that stays
  inside ``--out``, or a clean UnsafePath of one printable line; a whole random
  listing through ``pull_dir`` writes nothing outside ``--out`` and ends with a
  result or a remotemac error.
* redaction: a generated secret in any of the issue's forms, in any surrounding
  text, never survives ``redact``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import remotemac.agent
from remotemac.engine import pull
from remotemac.engine.ledger import redact
from remotemac.engine.pull import pull_dir, safe_relpath
from remotemac.errors import RemotemacError, UnsafePath

CI = settings(
    max_examples=int(os.environ.get("REMOTEMAC_FUZZ_EXAMPLES", "80")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

# ------------------------------------------------------------------ playbooks

SPECIAL_STRINGS = [
    "2h",
    "90s",
    "1e309",
    "9" * 60 + "h",
    ".nan",
    "nan",
    "inf",
    "-1",
    "0",
    "2GiB",
    "1e29TiB",
    "~/remotemac",
    "~",
    "/",
    "..",
    "../x",
    "/etc",
    "{device}",
    "{x}",
    "{",
    "}",
    "{matrix.a}",
    "local",
    "mac:99999",
    "mac:abc",
    "[::1",
    "[::1]:22",
    "u@h:22",
    "-oProxyCommand=x",
    "**/*",
    "[z-a]",
    "[",
    "\\",
    "*.npy",
    "data/",
    "proj",
    "proj/data",
    "proj/train.py",
    "public",
    "sensitive",
    "mps",
    "cpu",
    "auto",
    "remote",
    "after_pull",
    "manual",
    "relaunch",
    "x" * 300,
    "\x1b]52;c;QQ==\x07",
    "a\x00b",
    "é✓",
    "2026-12-03T18:00:00+00:00",
]
KEYS = [
    "name",
    "host",
    "hosts",
    "matrix",
    "remote_root",
    "project",
    "environment",
    "data",
    "workload",
    "outputs",
    "stop_when",
    "cost",
    "wipe",
    "reproduce",
    "on_lost",
    "purpose",
    "wipe_deadline",
    "path",
    "exclude",
    "include",
    "files",
    "max_bytes",
    "sample",
    "seed",
    "classification",
    "approved_for_remote",
    "encrypt",
    "command",
    "reference",
    "target",
    "device",
    "on",
    "fallback",
    "timeout",
    "env",
    "compare",
    "file",
    "rtol",
    "atol",
    "fallback_ops",
    "memory_growth",
    "max_memory",
    "min_free_disk",
    "hourly_rate",
    "currency",
    "python",
    "requirements",
    "venv",
    "goal",
    "resume_command",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.sampled_from(SPECIAL_STRINGS),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=12))
trees = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=5),
    max_leaves=16,
)


def base_playbook() -> dict[str, Any]:
    """A valid playbook whose paths exist in the fuzz directory (see :func:`fuzz_dir`)."""
    return {
        "name": "fuzz",
        "host": "local",
        "remote_root": "~/remotemac",
        "project": {"path": "proj", "exclude": ["*.ckpt"]},
        "environment": {"python": "python3", "requirements": "requirements.txt"},
        "data": {
            "path": "proj/data",
            "include": ["**/*.npy"],
            "max_bytes": "1MiB",
            "sample": {"files": 2, "seed": 0},
            "classification": "internal",
        },
        "workload": {
            "command": "python train.py --device {device} --out {output_dir}",
            "reference": {"device": "cpu"},
            "target": {"device": "mps"},
            "timeout": "1h",
            "env": {"OMP_NUM_THREADS": "2"},
        },
        "outputs": {
            "path": ".",
            "compare": [{"file": "m.json", "rtol": 1e-4}],
            "max_bytes": "1GiB",
        },
        "stop_when": {"fallback_ops": "any", "max_memory": "8GiB"},
        "cost": {"hourly_rate": 1.1, "currency": "USD"},
        "wipe": "after_pull",
    }


@st.composite
def mutated_playbooks(draw) -> Any:
    """A valid playbook with a few values (or keys) replaced by random trees."""
    book = base_playbook()
    for _ in range(draw(st.integers(1, 4))):
        node: Any = book
        for _depth in range(draw(st.integers(0, 2))):
            if isinstance(node, dict) and node:
                child = node[draw(st.sampled_from(sorted(node, key=str)))]
                if isinstance(child, dict):
                    node = child
        if isinstance(node, dict):
            key = draw(st.one_of(st.sampled_from(sorted(node, key=str) or ["name"]), keys))
            if draw(st.integers(0, 9)) == 0:
                node.pop(key, None)
            else:
                node[key] = draw(trees)
    return book


def _dump(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=10**6)


playbook_texts = st.one_of(
    mutated_playbooks().map(_dump),
    trees.map(_dump),
    st.text(max_size=200),
    mutated_playbooks()
    .map(_dump)
    .flatmap(lambda text: st.integers(0, len(text)).map(lambda cut: text[:cut])),
)


def fuzz_dir() -> Path:
    """A project the base playbook points at (made once per process)."""
    root = Path(tempfile.mkdtemp(prefix="remotemac-fuzz-"))
    data = root / "proj" / "data"
    data.mkdir(parents=True)
    (root / "proj" / "train.py").write_text("print(1)\n")
    (root / "proj" / "requirements.txt").write_text("numpy\n")
    for i in range(3):
        (data / f"{i}.npy").write_bytes(bytes(16 * i))
    return root


_FUZZ_DIR: Path | None = None
_RUNNER = CliRunner()


def check_playbook_text(text: str) -> str:
    """The playbook property for one text: returns "valid" or "refused"; raises on a bug."""
    global _FUZZ_DIR
    if _FUZZ_DIR is None:
        _FUZZ_DIR = fuzz_dir()
    from remotemac.cli import main

    path = _FUZZ_DIR / "book.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    result = _RUNNER.invoke(
        main,
        ["--home", str(_FUZZ_DIR / "home"), "run", "--dry-run", "--json", str(path)],
        catch_exceptions=True,
    )
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(
            f"uncaught {type(result.exception).__name__}: {result.exception}"
            f"\n--- playbook ---\n{text[:2000]}"
        )
    assert "internal error" not in out and "Traceback" not in out, (
        f"{out[-2000:]}\n--- playbook ---\n{text[:2000]}"
    )
    if result.exit_code == 0:
        plan = json.loads(out)
        json.dumps(plan, allow_nan=False)  # the plan (and the journal) are strict JSON
        return "valid"
    assert result.exit_code == 2, (result.exit_code, out[-2000:], text[:2000])
    errors = [line for line in out.splitlines() if line.strip()]
    assert errors and errors[0].startswith("remotemac: error: "), out[-2000:]
    if len(errors) > 1:  # several problems: one line each, each naming the file
        assert all(str(path) in line for line in errors[1:]), out[-2000:]
    return "refused"


def _with(path: tuple[str, ...], value: Any) -> str:
    book = base_playbook()
    node = book
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return _dump(book)


@pytest.mark.slow
@CI
@given(playbook_texts)
# found by the fuzz or the review; each was an internal error before the fix
@example("'[': null\n")
@example(_with(("data", "include"), ["[z-a]"]))
@example(_with(("data", "max_bytes"), "9" * 400 + "TiB"))
@example(_with(("workload", "timeout"), 10**400))
def test_any_playbook_is_valid_or_exit_2_never_internal(text):
    check_playbook_text(text)


# ------------------------------------------------------------------ remote names

name_bytes = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.sampled_from(
            [
                b"a",
                b"..",
                b".",
                b"/",
                b"\\",
                b"\x00",
                b"\xff",
                b"\xc3\xa9",
                b"\x1b[2J",
                b"\xe2\x80\xae",
                b".rmpart",
                b"x" * 255,
                b"y" * 256,
            ]
        ),
        max_size=12,
    ).map(b"".join),
    st.integers(1, 40).map(lambda n: b"/".join([b"d" * 250] * n)),
)
name_strs = st.text(max_size=200)


def check_remote_name(name: bytes | str) -> str:
    """The name property: "accepted" (and provably inside --out) or "refused" cleanly."""
    try:
        rel = safe_relpath(name)
    except UnsafePath as exc:
        line = exc.line()
        assert "\n" not in line and line.isprintable() and len(line) < 400, repr(line)
        return "refused"
    text = str(rel)
    raw = text.encode("utf-8")
    assert len(raw) <= getattr(pull, "MAX_NAME_BYTES", 1024) and all(
        len(p.encode()) <= 255 for p in rel.parts
    )
    assert not rel.is_absolute() and all(p not in ("", ".", "..") for p in rel.parts)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\\]", text)
    root = Path("/base/out")
    assert os.path.normpath(root.joinpath(*rel.parts)).startswith(str(root) + "/")
    return "accepted"


@CI
@given(st.one_of(name_bytes, name_strs))
def test_any_remote_name_is_a_safe_path_or_a_clean_refusal(name):
    check_remote_name(name)


class _ListingAgent:
    """An agent whose ``list_outputs`` answers a generated listing (the host is hostile)."""

    def __init__(self, entries: Any) -> None:
        self.entries = entries
        # what survives the listing's checks is fetched as a real pull does: this
        # machine's python runs the agent's pullops.py sender over the local transport
        self.python = sys.executable
        self.agent_dir = str(Path(remotemac.agent.__file__).parent)

    async def call(self, op: str, req: dict[str, Any], **_kw: Any) -> Any:
        return {"entries": self.entries}


entry_values = st.one_of(
    scalars,
    st.sampled_from(["file", "dir", "link", "other"]),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
)
listing_entries = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "path": st.one_of(name_strs, st.sampled_from(["a", "b/c", "d"])),
                "kind": st.sampled_from(["file", "dir", "link", "other", "x"]),
                "size": st.one_of(st.integers(-5, 1 << 40), scalars),
                "sha256": entry_values,
            },
            optional={"name_hex": st.one_of(name_bytes.map(bytes.hex), scalars)},
        ),
        trees,
    ),
    max_size=8,
)


def check_listing(entries: Any, work: Path) -> str:
    """A random listing through pull_dir against a real (local) host dir."""
    from remotemac.transport.local import LocalTransport

    remote = work / "host-out"
    remote.mkdir(parents=True, exist_ok=True)
    (remote / "a").write_bytes(b"a")
    (remote / "d").mkdir(exist_ok=True)
    dest = work / "out" / "results"
    try:
        asyncio.run(pull_dir(LocalTransport(), _ListingAgent(entries), str(remote), dest))
        outcome = "pulled"
    except RemotemacError as exc:
        assert "\n" not in exc.line()
        outcome = "refused"
    outside = [
        p
        for p in work.rglob("*")
        if p != work / "out"
        and work / "out" not in p.parents
        and remote not in p.parents
        and p != remote
    ]
    assert outside == [], outside
    return outcome


@settings(CI, max_examples=max(20, CI.max_examples // 4))
@given(listing_entries)
def test_any_listing_pulls_inside_out_or_refuses(entries):
    with tempfile.TemporaryDirectory() as tmp:
        check_listing(entries, Path(tmp))


# ------------------------------------------------------------------ redaction

words = st.lists(
    st.sampled_from(
        [
            "python",
            "train.py",
            "--epochs",
            "3",
            "--out",
            "/tmp/o",
            "&&",
            "echo",
            "ok",
            "-v",
            "x=1",
            "data/",
            ";",
            "|",
        ]
    ),
    max_size=5,
).map(" ".join)
password = st.text(
    alphabet="ABCDEFGHJKabcdefghjk0123456789!#%^*()_+=.~", min_size=6, max_size=30
).filter(lambda s: not s.startswith(("-", "=")))
token = st.text(alphabet="ABCDEFabcdef0123456789._~+/-", min_size=8, max_size=60).filter(
    lambda s: not s.startswith("-")
)


@st.composite
def random_b64(draw, urlsafe: bool) -> str:
    rnd = draw(st.randoms(use_true_random=False))
    raw = bytes(rnd.getrandbits(8) for _ in range(draw(st.integers(24, 64))))
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()


@st.composite
def secret_in_text(draw) -> tuple[str, str]:
    """(text, secret): one of the issue's forms, between random command words."""
    form = draw(
        st.sampled_from(
            ["bearer", "url", "short-p", "--pass", "assign", "flag", "b64", "b64url", "hex"]
        )
    )
    if form == "bearer":
        secret = draw(token)
        piece = f"-H 'Authorization: Bearer {secret}'"
    elif form == "url":
        secret = draw(password.filter(lambda s: "@" not in s and "/" not in s))
        piece = f"https://user:{secret}@example.com/x"
    elif form == "short-p":
        secret = draw(password)
        piece = f"-p{secret}"
    elif form == "--pass":
        secret = draw(password)
        piece = f"--pass {secret}"
    elif form == "assign":
        secret = draw(password.filter(lambda s: not any(c in s for c in "&;|")))
        name = draw(st.sampled_from(["API_TOKEN", "password", "db-pass", "SECRET_KEY", "auth"]))
        piece = f"{name}={secret}"
    elif form == "flag":
        secret = draw(password)
        name = draw(st.sampled_from(["--token", "--api-key", "--password", "--secret", "-passwd"]))
        piece = f"{name} {secret}"
    elif form in ("b64", "b64url"):
        secret = draw(random_b64(form == "b64url"))
        piece = secret
    else:
        rnd = draw(st.randoms(use_true_random=False))
        secret = f"{rnd.getrandbits(256):064x}"
        piece = secret
    text = " ".join([draw(words), piece, draw(words)])
    return text, secret


def check_redaction(case: tuple[str, str]) -> str:
    text, secret = case
    out = redact(text)
    assert secret not in out, (text, out)
    return "redacted"


@CI
@given(secret_in_text())
def test_a_generated_secret_never_survives_redaction(case):
    check_redaction(case)
