"""A bubblewrap sandbox per candidate: what `check --impl` and the evolve evaluator run candidate code in.

bubblewrap (`bwrap`, Debian's and Fedora's `bubblewrap` package; unprivileged user namespaces) builds each
sandbox; nothing here is a home-made one. A sandbox is one `bwrap` process holding a warm template
(engine/run/warm_server.py: torch and the harness imported, no candidate code run) that forks the
candidate's workers. Inside it:

* a read-only view of what the workers need: /usr, the interpreter's prefix, the virtual environment and
  the checkout; the receipt store, the checkout's .git, the signing key, the files a signing command names
  and the trust policy are masked (an empty folder, or /dev/null) wherever they fall inside that view;
* the candidate's bound files, copied into a staging folder this process owns and mounted read-only at
  /home/user/work (the working folder): the candidate runs exactly the bytes the receipt binds, and its module
  finds no sibling the receipt does not bind;
* a private, empty /tmp and home (/home/user); /proc of the sandbox's own PID namespace (no process outside,
  this one and the signer included, is visible); a minimal /dev; no network (`--unshare-all`); no
  capabilities; the host name `localhost`;
* an environment of only what Python, torch and the threads need (`--clearenv`), and Python in isolated
  mode (`-I`: no PYTHON* variables, no user site, no current folder on sys.path), so no `PYTHONPATH`,
  `sitecustomize` or `usercustomize` from anywhere writable is read;
* anonymous where the candidate's functions run (the call loop, `LoopBox`): nothing there names the checker.
  The loop is an ordinary `python -I -c` program (a few neutral lines that read the loop's code from the pipe:
  no file of it on disk, no `call_loop.py` in argv); the checkout is not shown; the virtual environment is shown
  at /home/user/.venv with its interpreter and packages, without this project's own distribution (its
  dist-info, its editable-install hooks) and with a pyvenv.cfg that names no folder of this machine; no
  variable names the checker. What remains detectable, and why unpredictable inputs rather than this are the
  defence, is docs/trust.md's "What a candidate can tell".
* `--die-with-parent` and a PID namespace of its own: when this process kills the sandbox (after the
  candidate's last call, before any receipt is built or signed), everything the candidate started dies
  with it, double-forked daemons included.

A sandbox serves one candidate and is then killed; a spare may be started ahead (`Pool`) so the next
candidate finds its imports done, but no template ever serves a second candidate.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from engine.errors import EnvironmentProblem, UsageError

LOOP = Path(__file__).with_name("call_loop.py")  # the candidate's side of the boundary (never imports the engine)
HOME = "/home/user"  # an ordinary user's home, inside: nothing in a path names the checker or its phases
INSIDE = f"{HOME}/work"  # where the candidate's files are, inside; the workers' folder
VENV = f"{HOME}/.venv"  # the interpreter and its packages, inside the call loop's sandbox
HOSTNAME = "localhost"
SOCKET = "/tmp/warm.sock"  # the template's own listener, in the sandbox's private /tmp
TOOL = "bubblewrap"
INSTALL = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"

# Variables a worker keeps inside: locale, time zone, thread counts, CUDA device selection. Never PATH's
# folders from outside, PYTHON*, LD_*, HOME or TMPDIR (each set below to something inside).
_KEEP = ("LANG", "LANGUAGE", "TZ", "PYTHONHASHSEED", "NO_COLOR", "TERM")  # none names the checker
_KEEP_PREFIX = ("LC_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA_VISIBLE", "CUBLAS_WORKSPACE")

_PROBE: dict = {}
_PROBE_LOCK = threading.Lock()


def bwrap() -> str | None:
    return shutil.which("bwrap")


def _once(key: str, probe: Callable[[], str | None]) -> str | None:
    """probe() the first time `key` is asked for in this process, its answer after that."""
    with _PROBE_LOCK:
        if key not in _PROBE:
            _PROBE[key] = probe()
        return _PROBE[key]


def unavailable() -> str | None:
    """Why no sandbox can be made here (one line), or None when bubblewrap runs; probed once per process."""
    return _once("why", _why_unavailable)


def _why_unavailable() -> str | None:
    exe = bwrap()
    if exe is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL}"
    try:
        done = subprocess.run([exe, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
                               *_system_binds(), "--proc", "/proc", "--dev", "/dev", "true"],
                              capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return f"bubblewrap did not run: {err}"
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return (f"bubblewrap cannot make a sandbox here ({tail[-1][:160] if tail else done.returncode}); "
                "it needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)")
    return None


def version() -> str | None:
    """`bubblewrap 0.8.0` -> `0.8.0`; None where it cannot be read."""
    return _once("version", _read_version)


def _read_version() -> str | None:
    exe = bwrap()
    if not exe:
        return None
    try:
        text = subprocess.run([exe, "--version"], capture_output=True, timeout=10).stdout.decode().split()
    except (OSError, subprocess.SubprocessError):
        return None
    return text[-1] if text else None


TMP_BYTES = 256 << 20  # the candidate's private /tmp (RAM): bounded, so no write there grows the host's memory
MASK_BYTES = 64 << 10  # a tmpfs that masks a hidden folder: nothing belongs there


def sizes_tmpfs() -> bool:
    """Whether this bubblewrap bounds a tmpfs (`--size`, bubblewrap 0.7 and later)."""
    return _once("size", _reads_size)


def _reads_size() -> bool:
    exe = bwrap()
    if not exe:
        return False
    try:
        text = subprocess.run([exe, "--help"], capture_output=True, timeout=10).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in text


def _tmpfs(path: str, size: int) -> list[str]:
    return (["--size", str(size)] if sizes_tmpfs() else []) + ["--tmpfs", path]


def require(no_sandbox: bool) -> bool:
    """True when candidate code is to run sandboxed; EnvironmentProblem (exit 4) when it cannot be and the caller
    did not say --no-sandbox."""
    if no_sandbox:
        return False
    why = unavailable()
    if why:
        raise EnvironmentProblem(f"candidate code runs only in a sandbox: {why}; or pass --no-sandbox (its receipt "
                                 "then records sandbox: none, which a trust policy requiring sandboxed refuses)")
    return True


def record(sandboxed: bool, checks_in: str) -> dict:
    """What a receipt says of its candidate's isolation (predicate.isolation)."""
    if not sandboxed:
        return {"sandbox": "none", "candidate": True, "checks_in": checks_in}
    return {"sandbox": TOOL, "candidate": True, "version": version(), "network": False, "pid_namespace": True,
            "python": "isolated", "checks_in": checks_in,
            # the private /tmp's bound in bytes (null: this bubblewrap cannot bound it)
            "tmp_bytes": TMP_BYTES if sizes_tmpfs() else None}


# A receipt of the registered implementation (or of source mutants): no candidate code ran.
NO_CANDIDATE = {"sandbox": "none", "candidate": False}


# --- what a sandbox sees ------------------------------------------------------------------------


def _system_binds() -> list[str]:
    """/usr and the merged-/usr links, and the few /etc files the dynamic loader and time zone read."""
    out = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / name
        if p.is_symlink():
            out += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            out += ["--ro-bind", str(p), str(p)]
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        out += ["--ro-bind-try", f, f]
    return out


def _trees() -> list[str]:
    """Folders the workers read: the interpreter's prefixes, where the interpreter really is, the checkout."""
    from engine.paths import project_root

    real = Path(os.path.realpath(sys.executable)).parent.parent
    cands = [Path(sys.base_prefix), Path(sys.prefix), real, project_root()]
    out: list[str] = []
    for c in cands:
        c = c.resolve()
        if str(c) in ("/", "/usr") or not c.is_dir():
            continue
        if any(c == Path(o) or Path(o) in c.parents for o in out):
            continue
        out = [o for o in out if c not in Path(o).parents] + [str(c)]
    return sorted(out)


def hidden_paths(receipts: os.PathLike | str | None = None, sign_key=None, sign_command=None,
                 trust: os.PathLike | str | None = None) -> list[str]:
    """What a sandbox must not show: the store, the key, the files a signing command names, the policy (and what
    their environment variables name), the checkout's .git."""
    import shlex

    from engine.paths import project_root

    out = [project_root() / ".git", project_root() / "receipts"]
    for p in (receipts, sign_key, trust, os.environ.get("CONTRACTS_SIGNING_KEY"), os.environ.get("CONTRACTS_TRUST"),
              os.environ.get("CONTRACTS_RECEIPTS")):
        if p:
            out.append(Path(p))
    for cmd in (sign_command, os.environ.get("CONTRACTS_SIGN_COMMAND")):
        words = list(cmd) if isinstance(cmd, (tuple, list)) else (shlex.split(cmd) if isinstance(cmd, str) else [])
        for w in words:  # a key or a script the command reads; never the interpreter or a system program
            p = Path(w)
            if p.is_absolute() or os.sep in w:
                if p.exists() and not (p.is_file() and os.access(p, os.X_OK)):
                    out.append(p)
    seen, paths = set(), []
    for p in out:
        try:
            r = str(Path(p).expanduser().resolve())
        except OSError:
            continue
        if r not in seen:
            seen.add(r)
            paths.append(r)
    return paths


def _env(threads_env: dict | None = None) -> dict[str, str]:
    src = os.environ if threads_env is None else threads_env
    env = {k: v for k, v in src.items() if k in _KEEP or k.startswith(_KEEP_PREFIX)}
    env.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "TMPDIR": "/tmp"})
    return env


# The call loop reaches the sandbox through its pipe, not its file system: these lines read one frame (a JSON
# header with the byte count n, then n bytes of source) and run it as the program's __main__.
BOOT = ("import json,os,sys\n"
        "def _read(fd):\n"
        " h=b''\n"
        " while not h.endswith(b'\\n'):\n"
        "  c=os.read(fd,1)\n"
        "  if not c:sys.exit(0)\n"
        "  h+=c\n"
        " n=json.loads(h)['n'];s=bytearray()\n"
        " while len(s)<n:\n"
        "  c=os.read(fd,n-len(s))\n"
        "  if not c:sys.exit(0)\n"
        "  s+=c\n"
        " return compile(bytes(s),'main.py','exec',optimize=2)\n"
        "_c=_read(int(sys.argv[1]));del _read\n"
        "__file__='main.py'\n"
        "exec(_c)\n")


def loop_source() -> bytes:
    """The call loop's code as BOOT receives it (its docstrings dropped by compile(optimize=2) there)."""
    return LOOP.read_bytes()


_RUNTIME: list[str] = []


def _runtime_dir() -> Path:
    """A folder of this process for the files the sandboxes show (a pyvenv.cfg); neutral name, removed at exit."""
    with _PROBE_LOCK:
        if not _RUNTIME or not Path(_RUNTIME[0]).is_dir():
            _RUNTIME[:] = [tempfile.mkdtemp()]
        return Path(_RUNTIME[0])


def _own_distributions() -> set[str]:
    """The distributions that provide this project's packages (paper-contracts), by normalised name."""
    try:
        from importlib import metadata

        by_package = metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - no metadata: nothing known to hide
        return set()
    return {d.lower().replace("_", "-") for top in ("engine", "methods", "tui") for d in by_package.get(top, [])}


_ENTRIES: dict = {}  # site folder -> (its and its __pycache__'s identity, the entries found then)


def _own_entries(site: Path) -> tuple[set[str], set[str]]:
    """(top-level entries of `site`, entries of its __pycache__) that belong to this project's distribution: its
    dist-info, an editable install's .pth and finder (and their bytecode), its packages if installed there.
    Reading every distribution's metadata takes about half a second, once per sandbox started: kept per folder
    while neither it nor its __pycache__ changes (an install or removal changes the folder's entries)."""
    key = []
    for d in (site, site / "__pycache__"):
        try:
            st = os.stat(d)
            key.append((st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            key.append(None)
    with _PROBE_LOCK:
        hit = _ENTRIES.get(str(site))
    if hit is not None and hit[0] == key:
        return set(hit[1]), set(hit[2])
    top, cached = _read_own_entries(site)
    with _PROBE_LOCK:
        _ENTRIES[str(site)] = (key, frozenset(top), frozenset(cached))
    return top, cached


def _read_own_entries(site: Path) -> tuple[set[str], set[str]]:
    try:
        from importlib import metadata

        dists = list(metadata.distributions(path=[str(site)]))
    except Exception:  # noqa: BLE001
        return set(), set()
    own = _own_distributions()
    top: set[str] = set()
    cached: set[str] = set()
    for d in dists:
        name = str(d.metadata.get("Name") or "").lower().replace("_", "-")
        if name not in own:
            continue
        for f in d.files or []:
            parts = Path(f).parts
            if not parts or parts[0] == "..":
                continue
            if parts[0] == "__pycache__" and len(parts) > 1:
                cached.add(parts[1])
            elif parts[0] != "__pycache__":
                top.add(parts[0])
    stems = {Path(t).stem for t in top}
    cache = site / "__pycache__"
    if cache.is_dir():
        cached |= {e for e in os.listdir(cache) if e.split(".")[0] in stems}
    return top, cached


def _site_view(site: Path, inside: str, cover: bool) -> list[str]:
    """bwrap arguments that show the site-packages folder `site` at `inside` without this project's own entries
    (one bind per entry then; one bind for the whole folder when there is nothing to leave out). `cover`: the
    folder is already shown there (a tree bound whole): a tmpfs covers it before its entries are bound back."""
    top, cached = _own_entries(site)
    if not top and not cached:
        return [] if cover else ["--ro-bind", str(site), inside]
    out = ["--tmpfs", inside] if cover else ["--dir", inside]
    for e in sorted(os.listdir(site)):
        if e in top:
            continue
        if e == "__pycache__" and cached:
            out += ["--dir", f"{inside}/{e}"]
            out += [x for c in sorted(os.listdir(site / e)) if c not in cached
                    for x in ("--ro-bind", str(site / e / c), f"{inside}/{e}/{c}")]
            continue
        out += ["--ro-bind", str(site / e), f"{inside}/{e}"]
    return out


def _site_dirs(prefix: Path) -> list[Path]:
    """The interpreter's site-packages folders under `prefix`, resolved, each once."""
    import site

    out: list[Path] = []
    for d in site.getsitepackages():
        p = Path(d).resolve()
        if p.is_dir() and (p == prefix or prefix in p.parents) and p not in out:
            out.append(p)
    return out


def _loop_view() -> tuple[list[str], str]:
    """(bwrap arguments showing the interpreter and its packages to the call loop, the python to run there).

    The base interpreter's folders at their paths; a virtual environment at VENV (its interpreter a symlink to the
    real one, a pyvenv.cfg naming only the interpreter's folder, its site-packages); never the checkout. Without a
    virtual environment, the prefix at its path, its site-packages covered where it holds this project."""
    real = Path(os.path.realpath(sys.executable))
    base = Path(sys.base_prefix).resolve()
    trees: list[Path] = []
    for c in (base, real.parent.parent):
        if str(c) not in ("/", "/usr") and c.is_dir() and not any(c == t or t in c.parents for t in trees):
            trees = [t for t in trees if c not in t.parents] + [c]
    args = [x for t in sorted(trees) for x in ("--ro-bind", str(t), str(t))]
    prefix = Path(sys.prefix).resolve()
    if prefix == base:  # no virtual environment: the packages are in the base prefix, shown at their paths
        for site in _site_dirs(prefix):
            args += _site_view(site, str(site), cover=True)
        return args, sys.executable
    cfg = _runtime_dir() / "pyvenv.cfg"
    if not cfg.is_file():
        cfg.write_text(f"home = {real.parent}\ninclude-system-site-packages = false\n"
                       f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    args += ["--dir", VENV, "--ro-bind", str(cfg), f"{VENV}/pyvenv.cfg", "--dir", f"{VENV}/bin",
             "--symlink", str(real), f"{VENV}/bin/python3", "--symlink", "python3", f"{VENV}/bin/python"]
    for site in _site_dirs(prefix):
        args += _site_view(site, f"{VENV}/{site.relative_to(prefix).as_posix()}", cover=False)
    return args, f"{VENV}/bin/python3"


def command(stage: str, hidden: list[str], device: str = "cpu", framework: str | None = None,
            control_fd: int | None = None, loop: tuple[int, int] | None = None) -> list[str]:
    """The bwrap command line of one sandbox running the warm template (control socket on `control_fd`), or,
    with `loop` (its two pipe ends), the call loop alone (engine/run/call_loop.py: the candidate, torch and
    that loop; nothing of the engine)."""
    from engine.paths import project_root

    args = [bwrap() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--clearenv", "--hostname", HOSTNAME, *_system_binds(),
            # first: a checkout or interpreter that lives under /tmp is bound over the private /tmp, not hidden by it
            "--proc", "/proc", "--dev", "/dev", *_tmpfs("/tmp", TMP_BYTES), "--dir", HOME]
    if loop is not None:  # the candidate's own process: the interpreter and its packages, never the checkout
        view, python = _loop_view()
        # the loop is PID 1 itself: no bubblewrap process inside whose /proc/N/cmdline lists every bind
        args += ["--as-pid-1", *view]
        trees = [str(Path(sys.base_prefix).resolve())]
    else:  # the template runs the engine: the checkout and the virtual environment at their paths
        python = sys.executable
        trees = _trees()
        for t in trees:
            args += ["--ro-bind", t, t]
    for h in hidden:  # masked wherever they fall inside what is shown
        hp = Path(h)
        if not any(hp == Path(t) or Path(t) in hp.parents for t in trees):
            continue
        if hp.is_dir():
            args += _tmpfs(h, MASK_BYTES)
        elif hp.exists():
            args += ["--ro-bind", "/dev/null", h]
    args += ["--ro-bind", stage, INSIDE, "--chdir", INSIDE]
    if device.startswith("cuda"):
        for dev in sorted(glob.glob("/dev/nvidia*")) + ["/dev/dri"]:
            args += ["--dev-bind-try", dev, dev]
        args += ["--ro-bind-try", "/sys", "/sys"]
    for k, v in sorted(_env().items()):
        args += ["--setenv", k, v]
    if loop is not None:  # the loop's code follows on the pipe (LoopBox): argv names no file of the checker
        return args + ["--", python, "-I", "-c", BOOT, str(loop[0]), str(loop[1])]
    root = str(project_root())
    code = (f"import sys; sys.path.insert(0, {root!r}); from engine.run.warm_server import main; "
            "sys.exit(main(sys.argv[1:]))")
    args += ["--", sys.executable, "-I", "-c", code, str(control_fd), SOCKET, *([framework] if framework else [])]
    return args


def stage(folder: str, ident: dict, target) -> dict:
    """Copy the files `ident` binds into `folder` (checked against their digests) and return the candidate's
    `target` as seen inside. UsageError when a file changed since it was hashed."""
    import hashlib

    from engine.run.impl_loader import SUBJECT_PREFIX, sources

    want = {s["name"]: s["digest"]["sha256"] for s in ident["subjects"]}
    for name, src in sources(target):
        data = Path(src).read_bytes()
        if want.get(SUBJECT_PREFIX + name) != hashlib.sha256(data).hexdigest():
            raise UsageError(f"--impl {ident['target']}: {name} changed while it was being checked; run again")
        dest = Path(folder, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    inside = {"form": target.form, "path": None, "module": target.module, "attribute": target.attribute,
              "framework": getattr(target, "framework", None), "name": getattr(target, "name", None)}
    if target.path is not None:
        inside["path"] = f"{INSIDE}/{target.path.name}"
    return inside


def outside(folder: str, path: str) -> str:
    """A path a sandboxed process reported, as it is here (a staged file's copy), else unchanged."""
    if path.startswith(INSIDE + "/"):
        return str(Path(folder, path[len(INSIDE) + 1:]))
    return path


def _bwrap_exit(code: int) -> str:
    """bwrap's exit status as the candidate's: it exits 128+N when its child was killed by signal N."""
    if code > 128:
        try:
            return f"was killed by {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"


class LoopBox:
    """One candidate's sandbox running the call loop (engine/run/call_loop.py) and nothing of the engine: the
    candidate's functions run there, the checks in this process (engine/run/boundary.py). Started before the
    candidate is known (torch imported, waiting), it serves one candidate and is then killed whole."""

    sandboxed = True

    def __init__(self, hidden: list[str] | None, device: str = "cpu"):
        from engine.run import boundary

        self.staged = False
        self.sandboxed = hidden is not None
        if hidden is None:  # --no-sandbox: the same process and boundary, no bwrap around it
            self.stage = None
            self.conn = boundary.plain(device)
            return
        self.stage = tempfile.mkdtemp()  # a neutral name: the mount table inside shows where a bind comes from
        self.conn = boundary.spawn(lambda r, w: command(self.stage, hidden, device, loop=(r, w)),
                                   {"PATH": "/usr/bin:/bin"}, _bwrap_exit)
        try:  # BOOT's one frame: the loop's code; the loop then says ready as before
            self.conn._send({"op": "main"}, loop_source(), end=time.monotonic() + 30)
        except Exception as exc:  # noqa: BLE001 - a sandbox that died at once: its first wait says why
            self.conn.lost = self.conn.lost or f"the candidate's process could not be started: {exc}"

    def stage_candidate(self, ident: dict, target) -> tuple[dict, str]:
        """The candidate's files staged (sandboxed) and its target and folder as the process sees them."""
        if self.staged:
            raise RuntimeError("a candidate process serves one candidate")
        self.staged = True
        if self.stage is None:
            return {"form": target.form, "path": str(target.path) if target.path else None,
                    "module": target.module, "attribute": target.attribute}, os.getcwd()
        return stage(self.stage, ident, target), INSIDE

    def outside(self, path: str) -> str:
        return outside(self.stage, path) if self.stage else path

    def alive(self) -> bool:
        return self.conn.lost is None and not self.conn.closed and self.conn.proc.poll() is None

    def wait_ready(self, timeout: float) -> bool:
        """Block until torch is imported inside (or the process died, or `timeout` passed)."""
        return self.conn.wait_ready(timeout)

    def close(self) -> None:
        self.conn.close(kill=True)  # bwrap and, with it (--die-with-parent, its PID namespace), all inside
        if self.stage:
            shutil.rmtree(self.stage, ignore_errors=True)

    def forget(self) -> None:
        pass  # a fork's copy: the pipes are the starter's


# --- one sandbox --------------------------------------------------------------------------------


def _warm():
    from engine.run import warm

    return warm


def _isolation():
    from engine.run import isolation

    return isolation


class Sandbox:
    """One candidate's sandbox: a bwrap process running a warm template; `spawn` forks a worker inside.

    It speaks engine.run.warm.WarmServer's interface (spawn, exit_status, exited, alive, close), so the
    workers are engine.run.warm.ForkedWorker; killing one of them kills the whole sandbox (its pids are the
    sandbox's own, meaningless here), and the calls it owned become errors like any lost worker's.
    """

    sandboxed = True

    def __init__(self, hidden: list[str], device: str = "cpu", framework: str | None = None,
                 startup_s: float | None = None):
        warm = _warm()
        self._server = warm.WarmServer.__new__(warm.WarmServer)
        srv = self._server
        srv._lock = threading.Lock()
        srv._next = 0
        srv._replies, srv._exits = {}, {}
        srv.owner = os.getpid()
        srv.started = time.monotonic()
        srv.startup_s = startup_s or warm.STARTUP_S
        srv.ready, srv.dead = False, None
        srv.path, srv.folder = SOCKET, None
        self.framework = framework
        self.device = device
        self.stage = tempfile.mkdtemp()
        self.staged = False
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        srv.log = tempfile.TemporaryFile()
        srv.proc = subprocess.Popen(command(self.stage, hidden, device, framework, theirs.fileno()),
                                    pass_fds=(theirs.fileno(),), env={"PATH": "/usr/bin:/bin"},
                                    stdin=subprocess.DEVNULL, stdout=srv.log, stderr=srv.log,
                                    start_new_session=True)
        theirs.close()
        srv.sock = mine
        self.killed = False

    # -- the candidate's files ---------------------------------------------------------------------

    def stage_candidate(self, ident: dict, target) -> dict:
        """Copy the files `ident` binds into the staging folder (checked against their digests) and return the
        worker's `target` as seen inside. UsageError when a file changed since it was hashed."""
        if self.staged:
            raise RuntimeError("a sandbox serves one candidate")
        self.staged = True
        return stage(self.stage, ident, target)

    def outside(self, path: str) -> str:
        """A path a worker reported, as it is here (a staged file's copy), else unchanged."""
        return outside(self.stage, path)

    # -- WarmServer's interface --------------------------------------------------------------------

    def spawn(self):
        if self.killed:
            from engine.run.isolation import WorkerLost

            raise WorkerLost("the candidate's sandbox was closed")
        return self._server.spawn()

    def exit_status(self, pid: int, timeout: float):
        if self.killed:
            return self._server._exits.pop(pid, None)
        return self._server.exit_status(pid, timeout)

    def exited(self, pid: int) -> bool:
        return self.killed or self._server.exited(pid)

    def alive(self) -> bool:
        return not self.killed and self._server.alive()

    def wait_ready(self, timeout: float) -> bool:
        """Block until the template has done its imports (or died, or `timeout` passed)."""
        from engine.run.isolation import WorkerLost

        try:
            self._server._wait(lambda: True if self._server.ready else None, timeout, "starting the sandbox")
            return True
        except WorkerLost:
            return False

    def kill_worker(self, pid: int) -> None:  # noqa: ARG002 - any worker lost: the whole sandbox goes
        self.kill()

    def kill(self) -> None:
        """Kill the sandbox and everything in it (its PID namespace ends with bwrap's child)."""
        if self.killed:
            return
        self.killed = True
        from engine.run.isolation import kill_group

        kill_group(self._server.proc)
        self._server.dead = "the candidate's sandbox was closed"

    def close(self) -> None:
        self.kill()
        for f in (self._server.sock, self._server.log):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.stage, ignore_errors=True)

    def forget(self) -> None:
        self._server.forget()

    def tail(self) -> str:
        from engine.run.isolation import log_tail

        return log_tail(self._server.log)


class Pool:
    """Fresh sandboxes, one per candidate; with `spare`, the next one is started as soon as one is taken so its
    imports run while the current candidate is checked. A spare has run nothing of any candidate."""

    def __init__(self, hidden: list[str] | None, device: str = "cpu", spare: bool = False,
                 spare_after_first: bool = False):
        self.hidden = None if hidden is None else list(hidden)
        self.device = device
        self.spare = spare
        # a process that checks a second candidate will likely check a third (a pipeline, the TUI, a test
        # suite): from then on keep one started; a one-shot `check --impl` starts none it would not use
        self.spare_after_first = spare_after_first
        self.taken = 0
        self.taken_of: dict[tuple, int] = {}
        self._spares: dict[tuple, "Sandbox | LoopBox"] = {}
        self._lock = threading.Lock()
        self.owner = os.getpid()

    def _make(self, key: tuple):
        loop, framework = key
        return LoopBox(self.hidden, self.device) if loop else Sandbox(self.hidden, self.device, framework)

    def prestart(self, framework: str | None = None, loop: bool = False) -> None:
        key = (loop and framework is None, framework)
        with self._lock:
            self._own()
            if key not in self._spares:
                self._spares[key] = self._make(key)

    def take(self, framework: str | None = None, loop: bool = False):
        """A fresh sandbox: with `loop` (and no framework) one running the call loop (a LoopBox), else a warm
        template forking workers (a Sandbox)."""
        key = (loop and framework is None, framework)
        with self._lock:
            self._own()
            box = self._spares.pop(key, None)
            if box is not None and not box.alive():
                box.close()
                box = None
            if box is None:
                box = self._make(key)
            self.taken += 1
            self.taken_of[key] = self.taken_of.get(key, 0) + 1
            if self.spare or (self.spare_after_first and self.taken_of[key] > 1):
                self._spares[key] = self._make(key)
            return box

    def _own(self) -> None:
        if self.owner != os.getpid():  # a fork of the process that started them: its spares are not ours
            for box in self._spares.values():
                box.forget()
            self._spares.clear()
            self.owner = os.getpid()

    def close(self) -> None:
        with self._lock:
            if self.owner == os.getpid():
                for box in self._spares.values():
                    box.close()
            self._spares.clear()

    def __del__(self) -> None:  # an evaluator dropped: its spare (torch imported, a few hundred MB) goes too
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit anything may be half torn down
            pass


_POOLS: dict[tuple, Pool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(hidden: list[str] | None, device: str) -> Pool:
    """This process's pool for these masks and this device (`check --impl` calls in one process share it);
    `hidden` None: bare call-loop processes (--no-sandbox)."""
    key = (None if hidden is None else tuple(hidden), device, os.getpid())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = Pool(hidden, device, spare_after_first=True)
        return pool


def _close_pools() -> None:
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()
    if _RUNTIME and os.getpid() == _RUNTIME_OWNER:
        shutil.rmtree(_RUNTIME[0], ignore_errors=True)


_RUNTIME_OWNER = os.getpid()


def _after_fork_in_child() -> None:
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()
    for pool in _POOLS.values():
        pool._own()
    _POOLS.clear()


class Boxed:
    """Workers for one candidate in its bubblewrap sandbox (engine/run/sandbox.py): the first worker starts the
    sandbox and stages the candidate's bound files in it; a lost worker takes the sandbox with it, and the next
    worker gets a fresh one. `close` kills it: nothing the candidate started outlives the run."""

    def __init__(self, ident: dict, target, hidden: list[str], device: str, pool: "Pool | None" = None):
        self.ident, self.target = ident, target
        self.pool = pool or shared_pool(hidden, device)
        self.box = None

    def __call__(self, init: dict):
        if self.box is None or not self.box.alive():
            self.close()
            self.box = self.pool.take(self.target.framework)
            self.inside = self.box.stage_candidate(self.ident, self.target)
        return _warm().ForkedWorker(self.box, dict(init, target=self.inside, cwd=INSIDE, env=_env()))

    def outside(self, path: str) -> str:
        return self.box.outside(path) if self.box is not None else path

    def close(self) -> None:
        if self.box is not None:
            self.box.close()
            self.box = None


def confine(ident: dict, target, hidden: list[str] | None, device: str, pool: "Pool | None" = None):
    """How one candidate is confined (engine.run.isolation.Confinement): with `hidden` (what the sandboxes
    mask), its functions in a fresh call-loop sandbox and any contract run beside it in a fresh template
    sandbox; without (--no-sandbox), the same boundary to a bare call-loop process, and warm-server workers.
    `pool`: where the processes come from (default this process's shared one)."""
    from engine.run.isolation import Confinement

    pool = pool or shared_pool(hidden, device)
    procs: list[LoopBox] = []

    def callee():
        box = pool.take(loop=True)
        procs.append(box)
        inside, cwd = box.stage_candidate(ident, target)
        return box.conn, inside, cwd, _env() if box.sandboxed else _isolation().worker_env()

    boxed = Boxed(ident, target, hidden, device, pool) if hidden is not None else None

    def close() -> None:
        for box in procs:
            box.close()
        procs.clear()
        if boxed is not None:
            boxed.close()

    return Confinement(record=record(hidden is not None, "supervisor"), callee=callee,
                       workers=boxed or _warm().warm_or_cold, outside=boxed.outside if boxed else (lambda p: p),
                       close=close)


import atexit  # noqa: E402 - beside what it registers

atexit.register(_close_pools)
os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["BOOT", "HOME", "HOSTNAME", "INSIDE", "VENV", "LoopBox", "Pool", "Sandbox", "command", "confine", "hidden_paths", "record", "require", "unavailable", "version"]
