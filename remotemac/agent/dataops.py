"""Host side of the dataset: verify it against the manifest, decrypt it into RAM.

Standard library only, plus ``cryptography`` (imported by streamcrypt) where the
slice is encrypted. The data key arrives in the request read from stdin and is
kept in memory only.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def _inside(base: str, rel: str) -> str:
    if os.path.isabs(rel) or ".." in rel.split("/"):
        raise ValueError("unsafe dataset path %r" % rel)
    return os.path.join(base, rel)


def op_prepare_data(req: dict[str, Any]) -> dict[str, Any]:
    """Verify (and decrypt) every manifest entry; answer where the workload reads it."""
    src = req["src"]
    entries: list[dict[str, Any]] = req["manifest"]
    mismatches: list[dict[str, str]] = []
    if not req.get("encrypted"):
        for entry in entries:
            path = _inside(src, entry["path"])
            if not os.path.isfile(path) or os.path.islink(path):
                mismatches.append({"path": entry["path"], "why": "missing"})
            elif _sha256(path) != entry["sha256"]:
                mismatches.append({"path": entry["path"], "why": "sha256 differs"})
        return {"data_dir": src, "mismatches": mismatches, "ram": None}

    import ramstore
    import streamcrypt

    key = bytes.fromhex(req["key_hex"])
    ram = ramstore.create_ram_store(
        req["run_dir"], int(req.get("ram_bytes", 64 << 20)), req["run_id"]
    )
    dest = ram["path"]
    for entry in entries:
        enc = _inside(src, entry["path"]) + ".rmenc"
        out = _inside(dest, entry["path"])
        os.makedirs(os.path.dirname(out), mode=0o700, exist_ok=True)
        try:
            streamcrypt.decrypt_file(key, entry["path"], enc, out)
        except (streamcrypt.DecryptError, OSError) as exc:
            mismatches.append({"path": entry["path"], "why": "decryption failed: %s" % exc})
            continue
        if _sha256(out) != entry["sha256"]:
            mismatches.append({"path": entry["path"], "why": "sha256 differs after decryption"})
    return {"data_dir": dest, "mismatches": mismatches, "ram": ram}
