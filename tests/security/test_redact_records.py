"""Issue 15 item 14: secrets do not survive in records, ledgers or the host's specs.

Before the fix the ledger's redaction missed base64 with ``/``, url-safe base64,
``Bearer`` tokens, URL credentials, ``-pPASS`` and ``--pass X``; the workload
command (tokens included) was stored verbatim in acceptance.json and
env/target.json; and ``workload.env`` values stayed in the host's
``status/*.spec.json`` after the wipe.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from remotemac.engine.ledger import REDACTED, redact
from tests.conftest import remotemac

AWS = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
URLSAFE = base64.urlsafe_b64encode(bytes(range(200, 232))).decode()  # has - and _
FORMS = {
    "base64 with /": (f"aws configure set secret {AWS}", AWS),
    "url-safe base64": (f"curl -d k={URLSAFE[:10]} {URLSAFE}", URLSAFE),
    "Bearer": ("curl -H 'Authorization: Bearer abcDEF123ghiJKL' x", "abcDEF123ghiJKL"),
    "URL credentials": ("git clone https://bob:hunter2pass@example.com/r.git", "hunter2pass"),
    "URL token": (
        "pip install git+https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/x",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    ),
    "-pPASS": ("mysql -uroot -pS3cretPass db", "S3cretPass"),
    "--pass X": ("tool --pass hunter22 --verbose", "hunter22"),
    "--password=X": ("tool --password='two words'", "two words"),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_redaction_covers_every_form_from_the_issue(form):
    text, secret = FORMS[form]
    out = redact(text)
    assert secret not in out and REDACTED in out, out


def test_redaction_keeps_paths_ids_and_plain_flags():
    for text in (
        "python3 /Users/researcher/remotemac/agent/0123abcd/hostagent.py launch",
        "tmux new-session -d -s remotemac-tiny-mlp-20261130-160915-abcd-target",
        "rm -rf /dev/shm/remotemac-tiny-mlp-20261130-160915-abcd",
        "python train.py --epochs 10 --batch-size 64 --out /home/me/runs/tinymlp/out",
        "mkdir -p /tmp/x",
        "ssh -p 2222 host",
    ):
        assert redact(text) == text


TOKEN_ENV = "zz-secret-value-42"
INLINE = "tOk3nVaLue9zz"
COMMAND = (
    f"SERVICE_TOKEN={INLINE} python3 emit.py --device {{device}} --out {{output_dir}} "
    "--lines 3 --seconds 0.1 # Bearer abcDEF123456xyz https://bob:hunter2pw@example.com "
    "-pPassw0rdX --pass hunter3pw"
)
SECRETS = (TOKEN_ENV, INLINE, "abcDEF123456xyz", "hunter2pw", "Passw0rdX", "hunter3pw")


def secret_book(make_preinstalled_playbook):
    return make_preinstalled_playbook(
        "secrets",
        workload={
            "command": COMMAND,
            "reference": None,
            "env": {
                "API_TOKEN": TOKEN_ENV,
                "OMP_NUM_THREADS": "2",
                "PYTORCH_ENABLE_MPS_FALLBACK": "1",
            },
        },
    )


@pytest.mark.e2e
def test_records_redact_the_command_and_env_and_the_wipe_scrubs_host_specs(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    out = tmp_path / "out"
    proc = remotemac("run", str(secret_book(make_preinstalled_playbook)), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    for path in [
        out / "acceptance.json",
        out / "acceptance.md",
        out / "ledger.jsonl",
        *sorted((out / "env").glob("*.json")),
    ]:
        text = path.read_text()
        for secret in SECRETS:
            assert secret not in text, (path.name, secret)
    target = json.loads((out / "env" / "target.json").read_text())
    assert "python3 emit.py" in target["command"] and REDACTED in target["command"]
    assert target["pytorch_env"].get("PYTORCH_ENABLE_MPS_FALLBACK") == "1"  # a knob, kept
    # the host's launch specs keep neither env values nor the command after the wipe
    run_dir = next((tmp_path / "host-root" / "runs").iterdir())
    specs = sorted((run_dir / "status").glob("*.spec.json"))
    assert specs
    for spec in specs:
        text = spec.read_text()
        assert all(secret not in text for secret in SECRETS), spec.name
        assert json.loads(text)["env"]["API_TOKEN"] != TOKEN_ENV


@pytest.mark.e2e
def test_show_secrets_keeps_them_in_the_records(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    out = tmp_path / "out"
    proc = remotemac(
        "run", str(secret_book(make_preinstalled_playbook)), "--out", str(out), "--show-secrets"
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    target = json.loads((out / "env" / "target.json").read_text())
    assert target["command"] == COMMAND
