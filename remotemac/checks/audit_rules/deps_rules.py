"""Dependency declarations: requirements, pyproject/Pipfile/locks, setup.cfg, conda files.

Line-oriented on purpose (no TOML/YAML parser): a finding must point at the
line a user edits, and lock files can be tens of megabytes.
"""

from __future__ import annotations

import re

from remotemac.checks.audit_rules.model import NOTE, RULES, Finding, make

# --------------------------------------------------------------------------- packages

#: import name (top level, or dotted prefix) -> rule
IMPORT_RULES: dict[str, str] = {
    "flash_attn": "flash-attn",
    "flash_attn_interface": "flash-attn",
    "xformers": "xformers",
    "bitsandbytes": "bitsandbytes",
    "apex": "apex",
    "deepspeed": "deepspeed",
    "vllm": "vllm",
    "cupy": "cupy",
    "cupyx": "cupy",
    "triton": "triton",
    "pycuda": "pycuda",
    "cuda": "pycuda",
    "tensorrt": "tensorrt",
    "torch_tensorrt": "tensorrt",
    "numba.cuda": "numba-cuda",
    "cudf": "rapids",
    "cuml": "rapids",
    "cugraph": "rapids",
    "torch.cuda.nccl": "nccl",
    "pynvml": "nvml",
}

#: normalised distribution name -> rule
DIST_RULES: dict[str, str] = {
    "flash-attn": "flash-attn",
    "flash-attn-3": "flash-attn",
    "xformers": "xformers",
    "bitsandbytes": "bitsandbytes",
    "apex": "apex",
    "deepspeed": "deepspeed",
    "vllm": "vllm",
    "cupy": "cupy",
    "triton": "triton",
    "pycuda": "pycuda",
    "cuda-python": "pycuda",
    "tensorrt": "tensorrt",
    "torch-tensorrt": "tensorrt",
    "cudf": "rapids",
    "cuml": "rapids",
    "cugraph": "rapids",
    "nvidia-ml-py": "nvml",
    "nvidia-ml-py3": "nvml",
    "pynvml": "nvml",
    "onnxruntime-gpu": "gpu-variant",
    "tensorflow-gpu": "gpu-variant",
    "paddlepaddle-gpu": "gpu-variant",
    "mxnet-cu": "gpu-variant",
}

#: conda package names that only exist for CUDA platforms
CONDA_CUDA = frozenset(
    {
        "cudatoolkit",
        "cuda-toolkit",
        "pytorch-cuda",
        "cudnn",
        "nccl",
        "cuda",
        "cuda-nvcc",
        "cuda-runtime",
        "cuda-cudart",
        "cuda-libraries",
        "pytorch-gpu",
        "tensorflow-gpu",
        "cutensor",
    }
)

SETUP_KWARGS = frozenset({"install_requires", "extras_require", "setup_requires", "tests_require"})
_NORM = re.compile(r"[-_.]+")
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$", re.S)
_CU_VERSION = re.compile(r"(?:\+|%2[bB])cu\d{2,3}")
_CUDA_INDEX = re.compile(
    r"download\.pytorch\.org/whl/(?:nightly/|test/)?cu\d+|pypi\.(?:ngc\.)?nvidia\.com"
    r"|/whl/cu\d+|data\.dgl\.ai/wheels/cu|conda\.anaconda\.org/nvidia|storage\.googleapis"
    r"\.com/jax-releases/jax_cuda"
)
_LINUX_MARKER = re.compile(
    r"(sys_platform|platform_system)\s*==\s*['\"](linux|win32|windows)['\"]"
    r"|sys_platform\s*!=\s*['\"]darwin['\"]|platform_system\s*!=\s*['\"]darwin['\"]"
    r"|platform_machine\s*==\s*['\"](x86_64|amd64|AMD64)['\"]",
    re.I,
)


def normalise(name: str) -> str:
    return _NORM.sub("-", name).lower()


def dist_rule(name: str) -> str | None:
    """The rule a distribution name falls under, if any."""
    n = normalise(name)
    if n in DIST_RULES:
        return DIST_RULES[n]
    if n.startswith("cupy-cuda"):
        return "cupy"
    if n.startswith(("cudf-", "cuml-", "cugraph-")):
        return "rapids"
    if n.startswith(("jax-cuda", "jaxlib-cuda", "mxnet-cu")):
        return "gpu-variant"
    if n.startswith("nvidia-"):
        return "nvml" if n.startswith("nvidia-ml") else "nvidia-wheel"
    return None


def url_rule(text: str) -> str | None:
    """cu-wheel for a CUDA build in a URL or version, cuda-index for a CUDA-only index."""
    if _CU_VERSION.search(text):
        return "cu-wheel"
    if _CUDA_INDEX.search(text):
        return "cuda-index"
    return None


def requirement_rules(req: str) -> tuple[list[str], bool]:
    """Rules hit by one PEP 508 requirement string, and whether a marker keeps it off macOS.

    Strings that are not requirements (descriptions, keywords) return no rules.
    """
    spec, _, marker = req.partition(";")
    m = _REQ.match(spec)
    if not m:
        return [], False
    name, extras, rest = m.group(1), m.group(2) or "", m.group(3).strip()
    if rest and rest[0] not in "=<>!~@(,*^":
        return [], False
    rules: list[str] = []
    rule = dist_rule(name)
    if rule:
        rules.append(rule)
    if re.search(r"cuda|gpu", extras, re.I):
        rules.append("gpu-variant")
    u = url_rule(rest)
    if u:
        rules.append(u)
    return rules, bool(_LINUX_MARKER.search(marker))


# --------------------------------------------------------------------------- dependency files

_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'')
_KEY = re.compile(r'^\s*"?([A-Za-z0-9_.-]+)"?\s*=')
_LOCK_NOTE = "Here it is pinned in a lock file; fix the declared dependency it comes from."
_MARKER_NOTE = "Here a marker keeps it off macOS."
_EXTRA_NOTE = "Here it is an optional extra or dependency group, not installed by default."


def _strip_comment(line: str, *, requirements: bool = False) -> str:
    """Drop a trailing ``#`` comment that is not inside quotes (or, for pip files, a URL)."""
    if requirements:
        return re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


class Lines:
    """Collects findings for a line-oriented file, one per (rule, line)."""

    def __init__(self, file: str, *, lock: bool = False) -> None:
        self.file = file
        self.lock = lock
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, int]] = set()
        self._lock_seen: set[tuple[str, str]] = set()

    def add(
        self,
        rule: str,
        lineno: int,
        text: str,
        *,
        linux_only: bool = False,
        key: str = "",
        optional: bool = False,
    ) -> None:
        if (rule, lineno) in self._seen:
            return
        if self.lock:
            # uv.lock repeats an index URL for every wheel: report each distinct thing once.
            k = (rule, key or text.strip())
            if k in self._lock_seen:
                return
            self._lock_seen.add(k)
        self._seen.add((rule, lineno))
        if self.lock:
            self.findings.append(
                make(rule, self.file, lineno, text.strip(), severity=NOTE, why_suffix=_LOCK_NOTE)
            )
        elif linux_only and RULES[rule].severity != NOTE:
            self.findings.append(
                make(rule, self.file, lineno, text.strip(), severity=NOTE, why_suffix=_MARKER_NOTE)
            )
        elif optional and RULES[rule].severity != NOTE:
            self.findings.append(
                make(rule, self.file, lineno, text.strip(), severity=NOTE, why_suffix=_EXTRA_NOTE)
            )
        else:
            self.findings.append(make(rule, self.file, lineno, text.strip()))

    def requirement(self, req: str, lineno: int, text: str, *, optional: bool = False) -> None:
        rules, linux_only = requirement_rules(req)
        for rule in rules:
            self.add(
                rule, lineno, text, linux_only=linux_only, key=normalise(req), optional=optional
            )

    def urls(self, s: str, lineno: int, text: str) -> None:
        rule = url_rule(s)
        if rule:
            m = _CUDA_INDEX.search(s)
            self.add(rule, lineno, text, key=m.group(0) if m and rule == "cuda-index" else text)


def scan_requirements(file: str, text: str) -> list[Finding]:
    """requirements*.txt / constraints*.txt: one requirement or pip option per line."""
    out = Lines(file)
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno, raw = i + 1, lines[i]
        while raw.endswith("\\") and i + 1 < len(lines):
            i += 1
            raw = raw[:-1] + " " + lines[i]
        i += 1
        line = _strip_comment(raw, requirements=True).strip()
        if not line:
            continue
        out.urls(line, lineno, line)
        if line.startswith("-"):
            continue  # --index-url / -f / -r / -e: only URLs matter, checked above
        out.requirement(line, lineno, line)
    return out.findings


_TOML_DEP_KEYS = frozenset(
    {
        "dependencies",
        "requires",
        "dev-dependencies",
        "constraint-dependencies",
        "override-dependencies",
    }
)


def scan_toml(
    file: str, text: str, *, names_are_keys: tuple[str, ...] = (), lock: bool = False
) -> list[Finding]:
    """pyproject.toml, Pipfile and TOML lock files, line by line (no TOML parser needed).

    Requirement strings only count inside dependency keys or tables, so a
    ``description`` or ``keywords`` entry that mentions triton is not a finding.
    ``names_are_keys`` lists tables whose keys are package names (Poetry, Pipfile).
    """
    out = Lines(file, lock=lock)
    section, key = "", ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if line.startswith("[") and not line.startswith(('["', "['")) and line.endswith("]"):
            section, key = line.strip("[] "), ""
            continue
        m = _KEY.match(line)
        if m:
            key = m.group(1)
        strings = [a or b for a, b in _QUOTED.findall(line)]
        if lock:
            if not m or key not in ("name", "version", "source", "url", "registry"):
                continue
            for s in strings:
                out.urls(s, lineno, line)
                if key == "name":
                    out.requirement(s, lineno, line)
            continue
        for s in strings:
            out.urls(s, lineno, line)
        in_dep_table = any(
            t in section for t in ("dependencies", "dependency-groups", "optional-dependencies")
        )
        optional = any(
            t in section
            for t in ("dependency-groups", "optional-dependencies", ".group.", "extras")
        )
        if m and (
            section in names_are_keys or (in_dep_table and section.startswith("tool.poetry"))
        ):
            out.requirement(key, lineno, line, optional=optional)
            if any(_LINUX_MARKER.search(s) for s in strings):
                continue
        elif in_dep_table or key in _TOML_DEP_KEYS:
            for s in strings:
                out.requirement(s, lineno, line, optional=optional)
    return out.findings


def scan_setup_cfg(file: str, text: str) -> list[Finding]:
    """setup.cfg: requirements under [options] install_requires and [options.extras_require]."""
    out = Lines(file)
    section, key = "", ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw, requirements=True).rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith(";"):
            continue
        if stripped.startswith("["):
            section, key = stripped.strip("[]").strip(), ""
            continue
        out.urls(stripped, lineno, stripped)
        value = stripped
        if not raw[:1].isspace() and ("=" in line or ":" in line):
            key, _, value = (p.strip() for p in re.split(r"([=:])", line, maxsplit=1))
        relevant = section == "options.extras_require" or (
            section == "options" and key in SETUP_KWARGS
        )
        if relevant and value:
            out.requirement(
                value,
                lineno,
                stripped,
                optional=section == "options.extras_require"
                or key in ("extras_require", "tests_require"),
            )
    return out.findings


def scan_conda(file: str, text: str, *, lock: bool = False) -> list[Finding]:
    """environment.yml and conda-lock.yml: channels, conda specs and nested pip lists."""
    out = Lines(file, lock=lock)
    top = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if not raw[:1].isspace() and stripped.endswith(":"):
            top = stripped[:-1]
        out.urls(stripped, lineno, stripped)
        m = re.match(r"^-?\s*(?:name:\s*)?(['\"]?)([^\s'\"]+)\1\s*$", stripped.lstrip("- "))
        is_item = stripped.startswith("-") or stripped.startswith("name:")
        if not (m and is_item):
            continue
        item = m.group(2)
        if lock and not stripped.lstrip("- ").startswith("name:"):
            continue
        if top == "channels":
            if item.lower() == "nvidia":
                out.add("conda-cuda", lineno, stripped)
            continue
        if item.startswith("-"):
            continue
        name = re.split(r"[=<>!~ \[]", item, maxsplit=1)[0].lower()
        build = item.split("=")[2] if item.count("=") >= 2 else ""
        if (
            name in CONDA_CUDA
            or name.startswith(("cuda-", "libcu", "magma-cuda"))
            or "cuda" in build.lower()
        ):
            out.add("conda-cuda", lineno, stripped, key=name)
        else:
            out.requirement(
                item.replace("=", "==", 1)
                if "==" not in item and "=" in item and not re.search(r"[<>!~]=", item)
                else item,
                lineno,
                stripped,
            )
    return out.findings


def scan_conda_explicit(file: str, text: str) -> list[Finding]:
    """An ``@EXPLICIT`` conda lock: one package URL per line; CUDA builds show in the name."""
    out = Lines(file, lock=True)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "@")):
            continue
        pkg = line.rsplit("/", 1)[-1]
        if "cuda" in pkg.lower() or "/nvidia/" in line:
            out.add("conda-cuda", lineno, pkg, key=pkg.split("-")[0])
        else:
            out.requirement(pkg.split("-")[0], lineno, pkg)
    return out.findings


def scan_json_lock(file: str, text: str) -> list[Finding]:
    """Pipfile.lock: package keys, pinned versions and source URLs."""
    out = Lines(file, lock=True)
    for lineno, raw in enumerate(text.splitlines(), 1):
        m = re.match(r'^\s*"([A-Za-z0-9._-]+)":\s*(.*)$', raw)
        if not m:
            continue
        k, rest = m.groups()
        if rest.startswith("{"):
            out.requirement(k, lineno, raw)
        elif k in ("version", "url"):
            out.urls(rest, lineno, raw)
    return out.findings
