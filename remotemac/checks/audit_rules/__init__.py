"""What ties a project to CUDA: the rule table and one detector per kind of file.

Detectors get the bytes of one file (the walker in ``scope`` reads each file
once) and return findings; they never touch the disk, so what is read is
decided in one place and every rule can be tested on a string.
"""

from remotemac.checks.audit_rules.build_rules import (
    scan_build_script,
    scan_cuda_source,
    scan_cxx,
)
from remotemac.checks.audit_rules.deps_rules import (
    requirement_rules,
    scan_conda,
    scan_conda_explicit,
    scan_json_lock,
    scan_requirements,
    scan_setup_cfg,
    scan_toml,
)
from remotemac.checks.audit_rules.model import (
    BLOCKER,
    NEEDS_REFACTOR,
    NOTE,
    RULES,
    SEVERITIES,
    Finding,
    Rule,
    make,
)
from remotemac.checks.audit_rules.python_rules import PythonScanner, scan_python

__all__ = [
    "BLOCKER",
    "NEEDS_REFACTOR",
    "NOTE",
    "RULES",
    "SEVERITIES",
    "Finding",
    "PythonScanner",
    "Rule",
    "make",
    "requirement_rules",
    "scan_build_script",
    "scan_conda",
    "scan_conda_explicit",
    "scan_cuda_source",
    "scan_cxx",
    "scan_json_lock",
    "scan_python",
    "scan_requirements",
    "scan_setup_cfg",
    "scan_toml",
]
