"""Fuzz the playbook loader and pull's name validation (issue 15's "Done when").

    PYTHONPATH=. python scripts/fuzz_playbook.py --examples 10000 [--target all] [--seed N]

Targets (the properties live in tests/security/test_input_fuzz.py, which CI runs
with fewer examples):

* ``playbook``: random YAML (trees, valid playbooks with random values in random
  places, raw and truncated text) through the real CLI, ``run --dry-run --json``:
  exit 0 with a plan, or exit 2 with one line per problem. Never an internal error.
* ``names``: random bytes and strings as remote result names: a safe relative path
  inside ``--out``, or a clean one-line UnsafePath.
* ``listing``: random output listings through ``pull_dir`` against a real local dir:
  nothing written outside ``--out``, a result or a remotemac error.
* ``redact``: a generated secret in one of the issue's forms never survives.

Prints one line per target: examples run, outcomes, seconds; exit 1 on any failure
(the failing example is printed, shrunk by Hypothesis).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.security import test_input_fuzz as props  # noqa: E402

TARGETS = {
    "playbook": (props.playbook_texts, props.check_playbook_text),
    "names": (st.one_of(props.name_bytes, props.name_strs), props.check_remote_name),
    "listing": (props.listing_entries, None),
    "redact": (props.secret_in_text(), props.check_redaction),
}


def run_target(name: str, examples: int, seed_value: int | None) -> bool:
    strategy, check = TARGETS[name]
    outcomes: collections.Counter[str] = collections.Counter()

    def one(value):
        if name == "listing":
            with tempfile.TemporaryDirectory() as tmp:
                outcomes[props.check_listing(value, Path(tmp))] += 1
        else:
            outcomes[check(value)] += 1

    test = settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )(given(strategy)(one))
    if seed_value is not None:
        test = seed(seed_value)(test)
    started = time.monotonic()
    ok = True
    try:
        test()
    except Exception as exc:  # noqa: BLE001 - report the shrunk failure and go on
        ok = False
        notes = "\n".join(getattr(exc, "__notes__", []))
        print(
            f"{name}: FAILED: {type(exc).__name__}: {str(exc)[:3000]}\n{notes[:3000]}", flush=True
        )
    took = time.monotonic() - started
    # Hypothesis also counts the examples it replays while shrinking; report what ran
    detail = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    print(
        f"{name}: {sum(outcomes.values())} examples ({detail}) in {took:.0f} s: "
        f"{'ok' if ok else 'FAILED'}",
        flush=True,
    )
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--target", choices=["all", *TARGETS], default="all")
    ap.add_argument("--seed", type=int, default=None, help="repeat a run exactly")
    args = ap.parse_args()
    names = list(TARGETS) if args.target == "all" else [args.target]
    results = [run_target(n, args.examples, args.seed) for n in names]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
