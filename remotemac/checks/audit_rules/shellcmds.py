"""Package installs in a shell command line: ``pip install -U bitsandbytes`` read as a
requirements file would be (a notebook's ``!pip`` lines, a ``%%bash`` cell).

Only installs count: ``pip install``/``pip3``/``python -m pip``/``uv pip``, and
``conda``/``mamba install`` by package name. Each package argument is a requirement
(``flash-attn==2.5.8``); an index or find-links URL is checked as in requirements
files (a CUDA wheel index has no macOS wheels).
"""

from __future__ import annotations

import re
import shlex

from remotemac.checks.audit_rules.deps_rules import requirement_rules, url_rule
from remotemac.checks.audit_rules.model import Finding, make

_SEPARATORS = re.compile(r"&&|\|\||;|\|")
#: options that take the next word as their value (not a package name)
_WITH_VALUE = frozenset(
    {
        "-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url",
        "-f", "--find-links", "-e", "--editable", "-t", "--target", "--prefix", "--root",
        "-n", "--name", "-p", "--python", "--platform", "--upgrade-strategy",
    }
)  # fmt: skip
_INSTALLERS = ("pip", "pip3", "conda", "mamba", "micromamba")


def _packages(words: list[str]) -> list[str]:
    """The package words of one install command, or [] when it installs nothing."""
    words = [w for w in words if w not in ("sudo",)]
    while words and ("=" in words[0] and not words[0].startswith("-")):
        words = words[1:]  # VAR=x pip install …
    if (
        len(words) >= 3
        and re.match(r"^python(\d(\.\d+)?)?$", words[0])
        and words[1:3]
        == [
            "-m",
            "pip",
        ]
    ):
        words = words[2:]
    if len(words) >= 2 and words[0] == "uv" and words[1] == "pip":
        words = words[1:]
    if len(words) < 2 or words[0].rsplit("/", 1)[-1] not in _INSTALLERS or words[1] != "install":
        return []
    out: list[str] = []
    skip = False
    for w in words[2:]:
        if skip:
            skip = False
        elif w in _WITH_VALUE:
            skip = True
        elif not w.startswith("-"):
            out.append(w)
    return out


def scan_shell_line(file: str, command: str, line: int) -> list[Finding]:
    """Findings for one shell command line (``line`` is where it was written)."""
    found: list[Finding] = []
    seen: set[str] = set()

    def add(rule: str) -> None:
        if rule not in seen:
            seen.add(rule)
            found.append(make(rule, file, line, command))

    for part in _SEPARATORS.split(command):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            words = part.split()
        packages = _packages(words)
        if not packages and not (words[1:2] == ["install"] or "install" in words[:4]):
            continue
        rule = url_rule(part)
        if rule:
            add(rule)
        for pkg in packages:
            rules, linux_only = requirement_rules(pkg)
            for rule in rules if not linux_only else []:
                add(rule)
    return found
