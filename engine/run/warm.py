"""Check many candidates fast: isolated workers forked from one warm server instead of started cold.

A cold `contracts check --impl` worker is a fresh `python` that imports torch
and every method package before it loads the candidate: seconds, on a busy
2-core machine, for checks that then take a fraction of that. Here one server
(engine/run/warm_server.py) does those imports once and forks a worker per
candidate (or several, to run a candidate's contracts side by side). What a
worker is stays what engine/run/isolation.py describes for the cold one:

* the server, and so every worker, has the allow-listed environment
  (isolation.worker_env: no key, token or credential variables);
* a worker runs exactly the cold worker's code (impl_worker.serve) and talks
  JSON over pipes of its own, never pickle; its answers are checked the same way;
* every call has the same deadline; past it, or when the worker dies
  (os._exit, a signal, sys.exit), its whole process group is killed and the
  calls it owned become `error` results; the next worker is a fresh fork;
* each candidate gets fresh forks: no module, global or monkeypatch of one
  candidate is seen by the next;
* the receipt is written by the process that owns the server, after the workers finish.

A forked worker starts from the server's memory (torch and the methods
imported, nothing run), so its first check call pays what a cold worker's
first call pays after its imports; nothing else differs. If the server itself
dies, the next request starts a new one.

Importing this module does not import torch.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from engine.run import impl_worker, warm_server  # noqa: F401 - they relay the measurements: bound with them
from engine.run.isolation import STARTUP_S, CandidateRun, Unit, WorkerLost, _lost, _Worker, worker_env

SPAWN_S = 30.0  # a fork of the warm server answering, on a loaded machine
EXIT_S = 10.0  # a killed worker's exit status reaching us


class WarmServer:
    """A handle on one warm fork server: its starter's (`WarmServer()`), or a forked process's own connection to
    the server its parent started (`WarmServer(path=...)`); one server serves a process and all its forks."""

    def __init__(self, startup_s: float = STARTUP_S, path: str | None = None, framework: str | None = None):
        self._lock = threading.Lock()
        self._next = 0
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}
        self.owner = os.getpid()
        self.started = time.monotonic()
        self.startup_s = startup_s
        self.ready = False
        self.dead: str | None = None
        self.proc = None
        self.log = None
        if path is not None:  # a fork of the starter: a connection of our own to the same server
            self.path, self.folder = path, None
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self.sock.connect(path)
            except OSError as exc:
                self.sock.close()
                raise WorkerLost(f"could not reach the warm server: {exc.strerror}") from None
            return
        # Its socket lives in a folder only this user can enter: whoever connects can have candidates loaded.
        self.folder = tempfile.mkdtemp(prefix="contracts-warm-")
        self.path = os.path.join(self.folder, "server.sock")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.run.warm_server", str(theirs.fileno()), self.path,
             *([framework] if framework else [])],
            pass_fds=(theirs.fileno(),), env=worker_env(), stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=self.log, start_new_session=True)  # its own group: no Ctrl-C from the terminal
        theirs.close()
        self.sock = mine

    # -- the control socket ---------------------------------------------------

    def _read_one(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except OSError as exc:
            data, why = b"", exc.strerror
        else:
            why = None
        if not data:
            code = self.proc.poll() if self.proc is not None else None
            self.dead = why or ("the warm server exited" + (f" with code {code}" if code is not None else ""))
            return
        try:
            msg = json.loads(data)
        except ValueError:
            return
        kind = msg.get("type")
        if kind == "ready":
            self.ready = True
        elif kind in ("spawned", "refused") and isinstance(msg.get("id"), int):
            self._replies[msg["id"]] = msg
        elif kind == "exit" and isinstance(msg.get("pid"), int) and isinstance(msg.get("status"), int):
            self._exits[msg["pid"]] = msg["status"]

    def _wait(self, pick: Callable[[], Any], timeout: float, what: str) -> Any:
        """Pump the control socket (several threads may) until `pick()` gives something, or WorkerLost."""
        end = time.monotonic() + timeout
        while True:
            with self._lock:
                got = pick()
                if got is not None:
                    return got
                if self.dead:
                    raise WorkerLost(f"{what}: {self.dead}")
                left = end - time.monotonic()
                # Read what is waiting before giving up: a server started long ago may have said "ready" while
                # nobody was listening, and a wait whose time is spent (timeout 0) must still see that.
                ready, _, _ = select.select([self.sock], [], [], min(max(left, 0.0), 0.05))
                if ready:
                    self._read_one()
                    continue
                if left <= 0:
                    raise WorkerLost(f"{what}: no answer from the warm server within {timeout:g} s")

    def alive(self) -> bool:
        if self.dead is not None:
            return False
        if self.proc is not None:
            return self.proc.poll() is None
        with self._lock:  # a connection of a fork: the server is gone when the connection reads as closed
            ready, _, _ = select.select([self.sock], [], [], 0)
            if ready:
                self._read_one()
        return self.dead is None

    def spawn(self) -> tuple[int, int, int, Any]:
        """A freshly forked worker: (pid, fd to write to it, fd to read from it, its log file)."""
        self._wait(lambda: True if self.ready else None,
                   max(self.startup_s - (time.monotonic() - self.started), 0.0), "starting the warm server")
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        log = tempfile.TemporaryFile()
        # O_APPEND: the worker's writes go to the end whatever offset our reads of its tail leave behind
        fcntl.fcntl(log.fileno(), fcntl.F_SETFL, fcntl.fcntl(log.fileno(), fcntl.F_GETFL) | os.O_APPEND)
        try:
            with self._lock:
                self._next += 1
                rid = self._next
                try:
                    socket.send_fds(self.sock, [json.dumps({"type": "spawn", "id": rid}).encode()],
                                    [to_r, from_w, log.fileno()])
                except OSError as exc:
                    self.dead = f"could not reach the warm server: {exc.strerror}"
            reply = self._wait(lambda: self._replies.pop(rid, None), SPAWN_S, "forking a worker")
        except BaseException:
            for fd in (to_w, from_r):
                os.close(fd)
            log.close()
            raise
        finally:
            os.close(to_r)
            os.close(from_w)
        if reply.get("type") != "spawned" or not isinstance(reply.get("pid"), int):
            os.close(to_w)
            os.close(from_r)
            log.close()
            raise WorkerLost(f"the warm server refused to fork: {reply.get('why')}")
        return reply["pid"], to_w, from_r, log

    def exit_status(self, pid: int, timeout: float) -> int | None:
        """The worker's exit status (negative: the signal), once the server reaped it; None if it cannot say."""
        try:
            return self._wait(lambda: self._exits.pop(pid, None), timeout, "waiting for a worker to exit")
        except WorkerLost:
            return None

    def exited(self, pid: int) -> bool:
        with self._lock:
            return pid in self._exits

    def close(self) -> None:
        """Close our connection; the starter also waits for the server, which exits once no connection is left."""
        try:
            self.sock.close()
        except OSError:
            pass
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a fork of ours still holds a connection: it keeps the server
            pass
        self.log.close()
        if self.proc.returncode is not None:
            self._remove_folder()

    def _remove_folder(self) -> None:
        for f in (self.path, self.folder):
            try:
                (os.unlink if f == self.path else os.rmdir)(f)
            except (OSError, TypeError):
                pass

    def forget(self) -> None:
        """In a forked copy of this process: drop our copies of the descriptors, touch nothing else."""
        for f in (self.sock, self.log):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


class ForkedWorker(_Worker):
    """isolation._Worker's interface (send, recv, close, tail) over a worker forked by a WarmServer."""

    def __init__(self, server: WarmServer, init: dict):  # noqa: D107 - not calling _Worker.__init__: no Popen
        self.server = server
        self.pid, self._w, self._r, self.log = server.spawn()
        self._buf = b""
        self.status: int | None = None  # its exit status, once the server has told us
        self.send(init)

    def _ended(self, timeout: float) -> int | None:
        if self.status is None:
            self.status = self.server.exit_status(self.pid, timeout)
        return self.status

    def _exit_code(self) -> int | None:
        return self._ended(EXIT_S)

    def _kill(self) -> None:
        if self.status is not None or self.server.exited(self.pid):
            return  # reaped already: the pid may belong to someone else by now
        if getattr(self.server, "sandboxed", False):
            self.server.kill_worker(self.pid)  # a pid of the sandbox's own namespace: the sandbox goes whole
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the worker made itself a group leader: its children go too
        except ProcessLookupError:
            try:
                os.kill(self.pid, signal.SIGKILL)  # killed before it got as far as its own group
            except ProcessLookupError:
                pass
        except PermissionError:
            pass

    def cpu_s(self) -> float | None:
        """CPU seconds this worker has used so far (Linux /proc), None where that cannot be read."""
        if getattr(self.server, "sandboxed", False):
            return None  # its pid is the sandbox's own
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def close(self, kill: bool = False) -> None:
        ended = self.status is not None or self.server.exited(self.pid)
        self.cpu_used = None if ended else self.cpu_s()
        if not kill and not ended:
            try:
                self.send({"type": "stop"})
                if self._ended(5) is None:
                    kill = True
            except WorkerLost:
                kill = True
        if kill and self.status is None:
            self._kill()
            self._ended(EXIT_S)
        self._release()


# --- one server per process ----------------------------------------------------------------------

_SERVER: WarmServer | None = None
_INHERITED: str | None = None  # in a forked process: the socket of the server its parent started
_SERVER_LOCK = threading.Lock()
# A framework target's workers (`--impl verl:...`) fork from a server of their own that has imported the framework
# too: never from the plain one, so no other candidate runs beside a framework it did not ask for.
_FRAMEWORK_SERVERS: dict[str, WarmServer] = {}


def server(framework: str | None = None) -> WarmServer:
    """This process's warm server: its parent's when this is a fork of the process that started one, else one of
    its own, started (or replaced, when it died) on first use. With `framework`, the one that has imported that
    framework as well (started on first use, never shared with forks)."""
    global _SERVER, _INHERITED
    with _SERVER_LOCK:
        if framework is not None:
            srv = _FRAMEWORK_SERVERS.get(framework)
            if srv is not None and not srv.alive():
                srv.close()
                srv = None
            if srv is None:
                srv = _FRAMEWORK_SERVERS[framework] = WarmServer(framework=framework)
            return srv
        if _SERVER is not None and not _SERVER.alive():
            _SERVER.close()
            _SERVER = None
        if _SERVER is None and _INHERITED is not None:
            path, _INHERITED = _INHERITED, None
            try:
                _SERVER = WarmServer(path=path)
            except WorkerLost:
                _SERVER = None  # that server is gone: start our own
        if _SERVER is None:
            _SERVER = WarmServer()
        return _SERVER


def start() -> None:
    """Start (or connect to) the server now, so its imports overlap with whatever the caller does next."""
    server()


def shutdown() -> None:
    global _SERVER
    with _SERVER_LOCK:
        for srv in [_SERVER, *_FRAMEWORK_SERVERS.values()]:
            if srv is not None and srv.owner == os.getpid():
                srv.close()
        _SERVER = None
        _FRAMEWORK_SERVERS.clear()


def _after_fork_in_child() -> None:
    global _SERVER, _INHERITED, _SERVER_LOCK
    _SERVER_LOCK = threading.Lock()
    if _SERVER is not None:
        _SERVER.forget()  # never share a connection: a fork connects on its own when it first needs a worker
        _INHERITED = _SERVER.path if _SERVER.dead is None else None
        _SERVER = None
    for srv in _FRAMEWORK_SERVERS.values():
        srv.forget()
    _FRAMEWORK_SERVERS.clear()


def forked_worker(init: dict) -> "ForkedWorker":
    """A worker for `init` (a candidate's init message) forked from this process's warm server: the plain one, or
    for a framework target the one that has imported that framework."""
    return ForkedWorker(server(init["target"].get("framework")), init)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(shutdown)


# --- running a candidate's cells ------------------------------------------------------------------


def warm_or_cold(init: dict) -> _Worker:
    """A worker for `init`: forked from this process's warm server, whose imports every later check in the
    process reuses (the TUI, a pipeline, a test suite); a fresh `python` where no server can be started on this
    platform. A server that starts and then dies is a lost worker, said in the results."""
    try:
        return forked_worker(init)
    except OSError:
        return _Worker(init)


def _is_lost(r: dict) -> bool:
    return r["status"] == "error" and str(r.get("message") or "").startswith("no measurement: ")


# What the last run_cells cost its workers: CPU seconds per thread of workers (for the benchmarks' idle projection).
last_stats: dict = {}


def run_cells(init: dict, calls: list[dict], timeout_s: float, jobs: int = 1,
              srv=None) -> tuple[list[dict], list[dict], list[str]]:
    """Run check calls against the candidate `init` names in forked workers, `jobs` at a time.

    One unit per (contract, seed): its dtypes run back to back in one worker. Once a worker is lost (a
    deadline, a crash, an exit), the candidate gets no further unit: what was not run becomes an `error`
    result saying why, so a hanging candidate costs one deadline, not one per contract. Returns (results in
    the order of `calls`, mechanism records, notes); a usage problem with the candidate (a missing function,
    a syntax error) raises UsageError, as with a cold worker. `srv`: the candidate's sandbox
    (engine/run/sandbox.py), else this process's warm server.
    """
    srv = server() if srv is None else srv
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(calls):
        groups.setdefault((c["contract"]["id"], c["seed"]), []).append(i)
    units = queue.Queue()
    # The mechanism runs are the long units: first, so the short ones fill in beside them (longest first).
    for idx in sorted(groups.values(), key=lambda idx: calls[idx[0]]["contract"]["kind"] != "mechanism"):
        units.put(idx)
    cpu: list[float] = []
    done: dict[int, dict] = {}
    mechanism: dict[int, list[dict]] = {}
    notes: list[str] = []
    failures: list[BaseException] = []
    lost: list[str] = []

    def work() -> None:
        mine: list[ForkedWorker] = []

        def fork(i: dict) -> ForkedWorker:
            w = ForkedWorker(srv, i)
            mine.append(w)
            return w

        cand = CandidateRun(init, timeout_s, worker_factory=fork)
        try:
            while True:
                try:
                    idx = units.get_nowait()
                except queue.Empty:
                    return
                unit_calls = [calls[i] for i in idx]
                if lost or failures:
                    for i, call in zip(idx, unit_calls):
                        done[i] = _lost(call, f"not run: an earlier call of this candidate lost its worker "
                                              f"({lost[0] if lost else 'see the other errors'})")
                    continue
                unit = Unit(label=unit_calls[0]["contract"]["id"], calls=unit_calls)
                cand.run(unit)
                for i, r in zip(idx, unit.results):
                    done[i] = r
                    if _is_lost(r) and not lost:
                        lost.append(r["message"][len("no measurement: "):])
                mechanism[idx[0]] = unit.mechanism
                if cand.load_failure and not lost:
                    lost.append(f"the candidate could not be run: {cand.load_failure}")
        except BaseException as exc:  # noqa: BLE001 - a UsageError, or anything else, goes to the caller
            failures.append(exc)
        finally:
            for n in cand.notes:
                if n not in notes:
                    notes.append(n)
            cand.close()
            cpu.append(sum(getattr(w, "cpu_used", None) or 0.0 for w in mine))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, min(jobs, len(groups))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last_stats.clear()
    last_stats["workers_cpu_s"] = sorted(cpu, reverse=True)
    if failures:
        raise failures[0]
    results = [done[i] for i in range(len(calls))]
    mech = [m for i in sorted(mechanism) for m in mechanism[i]]
    return results, mech, notes


__all__ = ["ForkedWorker", "WarmServer", "forked_worker", "run_cells", "server", "shutdown", "start", "warm_or_cold"]
