"""The host agent's typed records write back exactly the JSON they were read from.

The laptop, older agents and files already on hosts (ready files, ``.complete`` markers)
read and write these shapes; the dataclasses that replaced the dicts must not change a
key, a default or a value. Tier: fast (no marker: pure functions, no process).
"""

from __future__ import annotations

import json

from remotemac.agent import agentruntime, bring, hostfacts, safefs, venvops


def test_venv_answer_and_ready_file_keep_their_keys() -> None:
    built = venvops.VenvAnswer(
        interpreter="/usr/bin/python3.9",
        version="3.9.6",
        interpreter_is_venv=False,
        key="0123456789abcdef",
        installer="uv",
        venv_python="/r/envs/0123456789abcdef/bin/python",
        env_dir="/r/envs/0123456789abcdef",
        parent_site=[],
        seconds=1.5,
    )
    assert list(built.to_json()) == [
        "interpreter",
        "version",
        "interpreter_is_venv",
        "installer",
        "venv_python",
        "env_dir",
        "reused",
        "key",
        "parent_site",
        "seconds",
    ]
    assert built.ready_json() == {
        "interpreter": "/usr/bin/python3.9",
        "version": "3.9.6",
        "interpreter_is_venv": False,
        "installer": "uv",
        "key": "0123456789abcdef",
    }
    reused = venvops.VenvAnswer(
        interpreter="/p", version="3.12.1", interpreter_is_venv=True, key="k", reused=True
    )
    assert reused.to_json() == {
        "interpreter": "/p",
        "version": "3.12.1",
        "interpreter_is_venv": True,
        "venv_python": "",
        "env_dir": "",
        "reused": True,
        "seconds": 0.0,
        "key": "k",
    }


def test_venv_request_defaults_are_the_old_gets() -> None:
    req = venvops.VenvRequest.from_json({"root": "/r", "key": "k", "python": "", "uv": ""})
    assert (req.python, req.uv, req.requirements, req.system_site_packages) == (
        "python3",
        None,
        None,
        False,
    )


def test_interpreter_identity_reads_the_probe_line() -> None:
    line = {
        "executable": "/v/bin/python",
        "real": "/usr/bin/python3.9",
        "version": "3.9.6",
        "prefix": "/v",
        "base_prefix": "/usr",
        "purelib": "/v/lib/python3.9/site-packages",
        "platlib": "/v/lib/python3.9/site-packages",
    }
    ident = venvops.InterpreterIdentity.from_json("/v/bin/python", line)
    assert ident.in_venv and ident.found == "/v/bin/python"
    # the env key hashes the same three values the dict did
    assert venvops.venv_key("k", ident) == venvops.venv_key(
        "k", venvops.InterpreterIdentity.from_json("/other", line)
    )


def test_runtime_marker_round_trips_with_unknown_keys() -> None:
    written = {
        "key": "abc",
        "method": "offline",
        "installed": ["cryptography==46.0.3"],
        "cryptography": "46.0.3",
        "python": "3.9.6",
        "installed_at": 1764680000.25,
        "added_by_a_newer_agent": {"x": 1},
    }
    marker = agentruntime.RuntimeMarker.from_json(json.loads(json.dumps(written)))
    assert marker.to_json() == written and list(marker.to_json()) == list(written)
    old = {"key": "abc", "method": "online"}  # a marker missing keys stays as it was
    assert agentruntime.RuntimeMarker.from_json(old).to_json() == old


def test_brought_marker_names_what_and_method_even_when_unset() -> None:
    built = bring.BroughtMarker(
        what=None, name="uv-0.9.tar.gz", sha256="f" * 64, method=None, archive_bytes=3
    )
    assert built.to_json() == {
        "what": None,
        "name": "uv-0.9.tar.gz",
        "sha256": "f" * 64,
        "method": None,
        "archive_bytes": 3,
        "bytes": 0,
        "installed_at": 0.0,
    }
    probed = dict(built.to_json(), what="uv", method="online", exe="uv/uv", version="0.9.2")
    assert bring.BroughtMarker.from_json(probed).to_json() == probed


def test_df_rows_and_pmset_settings_as_facts() -> None:
    row = hostfacts.DfRow("/dev/disk3s1", 100, 40, 60, "40%", "/System/Volumes/Data/")
    assert row.mount == "/System/Volumes/Data"
    assert set(row.to_json()) == {
        "filesystem",
        "size_bytes",
        "used_bytes",
        "avail_bytes",
        "capacity",
        "mounted_on",
    }
    parsed = hostfacts.parse_pmset_g(" sleep 1 (sleep prevented by x)\n standby 0\n")
    assert parsed.to_json() == {
        "sleep": 1,
        "standby": 0,
        "notes": {"sleep": "(sleep prevented by x)"},
    }
    assert hostfacts.parse_pmset_g(" standby 0\n").to_json() == {"standby": 0}
    assert parsed.pick(("sleep", "SleepDisabled")) == {
        "sleep": 1,
        "SleepDisabled": None,
        "notes": {"sleep": "(sleep prevented by x)"},
    }


def test_removal_reads_as_the_old_answer() -> None:
    done = safefs.Removal(bytes=5, entries=2, failed=["a: busy"])
    assert done.to_json() == {"bytes": 5, "entries": 2, "failed": ["a: busy"], "notes": []}
    assert safefs.Marker.from_json({"kind": "run", "run_id": "r1", "pid": 9}) == safefs.Marker(
        kind="run", run_id="r1"
    )


def test_start_identity_is_what_status_files_hold() -> None:
    from remotemac.agent import procid

    for recorded in ({"start": "linux:boot:123"}, {"start_s": 1764680000.5}):
        found = procid.StartIdentity.from_json(recorded)
        assert found is not None and found.to_json() == recorded
    assert procid.StartIdentity.from_json(None) is None
    assert procid.StartIdentity.from_json("linux:boot:1") is None
    import os

    mine = procid.identity(os.getpid())
    assert mine is not None and procid.same_start(os.getpid(), mine)
    assert not procid.same_start(os.getpid(), {"start": "linux:other-boot:1", "start_s": 0})


def test_access_checks_and_plan_travel_unchanged() -> None:
    from remotemac.agent import guards

    for line in (
        {"what": "data dir", "path": "/d", "mode": "read", "ok": True, "entries": 3},
        {
            "what": "cache X",
            "path": "/c",
            "mode": "write",
            "ok": False,
            "error": "Permission denied",
        },
        {"what": "output dir", "path": "/o", "mode": "write", "ok": True},
    ):
        assert guards.AccessCheck.from_json(line).to_json() == line
    plan = {"read": [["data dir", "/d"]], "write": [["output dir", "/o"]]}
    assert guards.AccessPlan.from_json(plan).to_json() == plan
    assert guards.plan_access({"REMOTEMAC_DATA": "/d", "REMOTEMAC_OUTPUT": "/o"}).to_json() == plan


def test_host_identity_failure_and_found_python_as_json() -> None:
    from remotemac.agent import envfreeze, harness, pythons

    mac = envfreeze.HostIdentity("Darwin", "arm64", "m", "14.5", "Apple M2", False, True)
    assert list(mac.to_json()) == [
        "os",
        "arch",
        "hostname",
        "os_version",
        "chip",
        "translated",
        "vm",
    ]
    assert "vm" not in envfreeze.HostIdentity("Linux", "x86_64", "h", "6.1", "").to_json()
    failure = harness.classify(ValueError("bad shape"))
    assert failure.to_json() == {
        "unsupported_ops": [],
        "dtype_errors": [],
        "oom": False,
        "stopping_conditions": [{"code": "workload-failed", "detail": "ValueError: bad shape"}],
    }
    found = pythons.FoundPython("/usr/bin/python3", "/usr/bin/python3.9", "3.9.6", False)
    assert found.to_json() == {
        "path": "/usr/bin/python3",
        "real": "/usr/bin/python3.9",
        "version": "3.9.6",
        "brought": False,
    }


def test_call_frame_and_process_record_read_the_old_keys() -> None:
    from remotemac.agent import obsmerge, resident

    call = resident.Call.from_json({"id": 7, "op": "ping", "store": ""})
    assert (call.id, call.op, call.req, call.store) == ("7", "ping", {}, None)
    rec = obsmerge.ProcessRecord.from_json(
        {
            "pid": 5,
            "argv0": "train.py",
            "operators": {"fallback_ops": [{"op": "aten::x", "count": 2}, {"op": "aten::y"}]},
            "mps_memory": {"mps_driver_allocated_bytes": 10},
        }
    )
    assert rec.fallback_counts == [("aten::x", 2), ("aten::y", 1)]
    assert rec.mps_driver_allocated_bytes == 10
    assert rec.process_json()["argv0"] == "train.py" and rec.process_json()["ppid"] is None
