"""What a receipt binds: the files that measured, and what in the environment can change numbers.

Files: every module the measuring process(es) imported from the checkout (read
from `sys.modules` after the run), all of every `methods/<package>` that was
imported, the spec and checkpoint files (added by the runner). The process that
runs `contracts check` also imported its front doors (CLI, TUI, cache, index,
gate, verify): they print and judge, they never measure, so FRONT_DOORS names
them and they are left out; tests/test_binding.py checks that the measuring
modules never import them. A local or Ray worker imports only what measures,
so it reports every checkout module it imported (`imported_files(front_doors=False)`).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path
from typing import Iterable

# Presentation and judging code: imported by the `contracts` process, never by the code that measures.
# A module is a front door when its dotted name equals one of these or starts with it plus ".".
FRONT_DOORS = (
    "engine.cli",  # argument parsing and printing, one module per verb
    "engine.pytest_plugin",  # the pytest front door (it drives engine.run like the CLI does)
    "engine.gate",  # the gate, promote and its statistics judge receipts after the fact
    "engine.store.cache",  # display accelerators for list/show/tui
    "engine.store.index",
    "engine.store.coverage",  # full or partial, read from a written predicate
    "engine.store.verify",  # verify reads receipts; it never runs a check
    "engine.store.ledger",  # promotion history, written by promote
    "engine.store.locking",  # the promotion lock
    "engine.evolve",  # the OpenEvolve evaluator drives runs like the CLI and scores their receipts
    "tui",  # the Textual app
)
# The project's test suite drives runs in-process (pytest's front door); its files are left out by path.
FRONT_DOOR_PATHS = ("tests/", "conftest.py")

METHODS = "methods"
_SKIP_PARTS = frozenset({"__pycache__"})


def is_front_door(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FRONT_DOORS)


def _rel(path: str | os.PathLike, root: Path) -> str | None:
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except (ValueError, OSError):
        return None


def package_files(folder: Path, root: Path) -> list[str]:
    """Every file of a method package (sources and data), repository-relative; bytecode caches left out."""
    out = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).parts
        if any(part in _SKIP_PARTS or part.startswith(".") for part in rel) or p.suffix in (".pyc", ".pyo"):
            continue
        if p.is_file():
            r = _rel(p, root)
            if r is not None:
                out.append(r)
    return out


def _installed_dirs(root: Path) -> list[str]:
    """Interpreter and site-packages folders that lie inside the checkout (a `.venv/`): installed, not checkout code."""
    import site

    dirs = {sys.prefix, sys.exec_prefix, sys.base_prefix, *site.getsitepackages()}
    try:
        dirs.add(site.getusersitepackages())
    except Exception:  # noqa: BLE001 - no user site in some interpreters
        pass
    out = []
    for d in dirs:
        rel = _rel(d, root)
        if rel not in (None, "", "."):
            out.append(rel + "/")
    return out


# Where each loaded module's file lies in the checkout, by (root, module id, file): resolved once per module, so a
# long-lived process (the OpenEvolve evaluator writes a receipt per candidate) does not resolve thousands again.
_REL: dict[tuple, str | None] = {}


def imported_files(root: Path, front_doors: bool = True) -> list[str]:
    """Repository-relative files of the checkout modules in sys.modules (without FRONT_DOORS when asked),
    widened to the whole folder of every `methods.<package>` among them. Files that no longer exist are
    listed too (see `build_statement`)."""
    root = Path(root).resolve()
    files: set[str] = set()
    packages: set[str] = set()
    installed = tuple(_installed_dirs(root))
    for name, mod in list(sys.modules.items()):
        spec = getattr(mod, "__spec__", None)
        name = getattr(spec, "name", None) or name  # `python -m engine.cli` runs engine.cli.__main__ as __main__
        if front_doors and is_front_door(name):
            continue
        origin = getattr(mod, "__file__", None)
        if not isinstance(origin, str) or not os.path.isabs(origin):  # e.g. torch._classes says "_classes.py"
            continue
        key = (root, id(mod), origin)
        rel = _REL[key] if key in _REL else _REL.setdefault(key, _rel(origin, root))
        # A file that is gone is kept: a module that deleted itself after its import still ran, and the
        # receipt must say so (git_state calls it untracked or modified; it cannot be a subject).
        if rel is None or rel.startswith(installed) or not ((root / rel).is_file() or not (root / rel).exists()):
            continue
        if front_doors and rel.startswith(FRONT_DOOR_PATHS):
            continue
        files.add(rel)
        parts = name.split(".")
        if parts[0] == METHODS and len(parts) >= 2 and rel.startswith(f"{METHODS}/{parts[1]}/"):
            packages.add(parts[1])
    for pkg in packages:
        files.update(package_files(root / METHODS / pkg, root))
    return sorted(files)


# --- the numeric environment --------------------------------------------------------------

# Environment variables that can change a run's numbers (thread pools, reduction order, TF32, cuBLAS
# workspaces, hash seeds). Names are fixed here; values are recorded only in a short, plain form, so a
# variable cannot smuggle a secret into a receipt.
DETERMINISM_ENV = (
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "CUDNN_DETERMINISTIC", "NVIDIA_TF32_OVERRIDE",
    "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "MKL_CBWR", "KMP_DETERMINISTIC_REDUCTION", "OMP_DYNAMIC", "MKL_DYNAMIC",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "TORCH_BLAS_PREFER_CUBLASLT", "TORCH_CUDNN_V8_API_DISABLED",
)
_TORCH_NUMERIC = re.compile(r"^TORCH_\w*(DETERMINISTIC|TF32|CUDNN|CUBLAS|MATMUL|PRECISION|REDUCED)\w*$")
_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9:._,+-]{0,32}$")
WITHHELD = "<withheld: not a short plain value>"


def determinism_env(environ: dict | None = None) -> dict[str, str]:
    """The determinism-relevant variables that are set, with their values (or WITHHELD)."""
    env = os.environ if environ is None else environ
    out = {}
    for k in sorted(env):
        if k in DETERMINISM_ENV or _TORCH_NUMERIC.match(k):
            v = env[k]
            out[k] = v if _PLAIN_VALUE.match(v) else WITHHELD
    return out


def numeric_environment() -> dict:
    """Versions and settings of this process that can change numbers (torch must be imported)."""
    import torch

    cudnn = None
    try:
        if torch.backends.cudnn.is_available():
            cudnn = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - a broken cuDNN install is recorded as none
        cudnn = None
    return {
        "python_implementation": platform.python_implementation(),
        "cuda_build": torch.version.cuda,
        "cudnn": cudnn,
        "determinism": {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "torch_interop_threads": torch.get_num_interop_threads(),
        },
        "env": determinism_env(),
    }


# --- the checkout against its commit --------------------------------------------------------


def _git(root: Path, *args: str) -> str | None:
    import subprocess

    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.decode("utf-8", "surrogateescape") if r.returncode == 0 else None


def _is_bytecode_or_build(path: str) -> bool:
    parts = path.split("/")
    return ("__pycache__" in parts or path.endswith((".pyc", ".pyo"))
            or any(p.endswith(".egg-info") for p in parts))


def _blob_id(path: Path, sha256: bool) -> str | None:
    import hashlib

    try:
        data = path.read_bytes()
    except OSError:
        return None
    h = hashlib.sha256() if sha256 else hashlib.sha1()
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


WATCHED = ("engine", METHODS)  # untracked or modified files here make a run dirty


def git_state(root: Path, bound: Iterable[str] = ()) -> dict | None:
    """{commit, dirty, untracked, modified} of the checkout, or None outside git.

    `untracked`/`modified`: repository-relative files under engine/ or methods/ that are not in the
    commit or differ from it (git status, ignored sources listed file by file: an ignore rule must not hide a
    module), plus every bound file whose content is not the commit's (index flags such as
    skip-worktree cannot hide it: the bytes are compared with the commit's blobs).
    """
    root = Path(root)
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return None
    commit = commit.strip()
    untracked: set[str] = set()
    modified: set[str] = set()
    status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored=traditional", "--",
                  *WATCHED)
    if status is None:
        return None
    entries = status.split("\0")
    i = 0
    while i < len(entries):
        e = entries[i]
        i += 1
        if len(e) < 4:
            continue
        code, path = e[:2], e[3:]
        if code[0] in "RC":  # a rename's source path follows
            i += 1
        if _is_bytecode_or_build(path):
            continue
        if code in ("??", "!!"):
            untracked.add(path)
        else:
            modified.add(path)
    bound = sorted(set(bound))
    if bound:
        tree = _git(root, "ls-tree", "-r", "-z", "HEAD", "--", *bound) or ""
        blobs = {}
        for line in tree.split("\0"):
            meta, _, name = line.partition("\t")
            if name:
                blobs[name] = meta.split()[-1]
        for name in bound:
            if name not in blobs:
                untracked.add(name)
            elif _blob_id(root / name, len(commit) == 64) != blobs[name]:
                modified.add(name)
    modified -= untracked
    return {"commit": commit, "dirty": bool(untracked or modified), "untracked": sorted(untracked),
            "modified": sorted(modified)}
