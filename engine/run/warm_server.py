"""The warm fork server behind engine/run/warm.py: `python -m engine.run.warm_server CONTROL_FD SOCKET_PATH
[FRAMEWORK]`.

Started with the scrubbed environment of every candidate worker
(engine.run.isolation.worker_env), it imports torch, the runner and every
method package once (and, given FRAMEWORK, what that framework's adapter
preloads: verl and what it imports), then forks one worker per request. Requests come over
AF_UNIX SOCK_SEQPACKET connections, one JSON object per message: CONTROL_FD
is its starter's, and SOCKET_PATH (in a folder only this user can enter)
takes more, from processes forked from the starter (an OpenEvolve pool
worker), so they share this one warm process instead of starting their own.
A request carries three file descriptors: the worker's end of its two pipes
and its log file. The forked worker starts a session of its own (so the
parent can kill it and whatever it spawned as one group), points stdout and
stderr at the log, and runs exactly what a cold worker runs
(engine.run.impl_worker.serve): it loads the candidate and answers units over
its own pipes, never over a control connection. It then exits; it never
returns into this loop.

This process runs no candidate code and no check: forking it gives each
candidate a fresh interpreter state with the imports already done. It tells
the connection that asked for each worker how it ended (`{"type": "exit",
"pid", "status"}`, status negative for a signal). A connection that closes has
its workers killed; when the last one closes, the server removes its socket and exits.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys

_MAX_MESSAGE = 1 << 16


def _send(ctrl: socket.socket, msg: dict) -> None:
    try:
        ctrl.send(json.dumps(msg).encode())
    except OSError:
        pass  # the parent is gone: the loop sees the closed socket next


def _status(code: int) -> int:
    """waitpid's status as an exit code, negative for a signal (subprocess's convention)."""
    if os.WIFSIGNALED(code):
        return -os.WTERMSIG(code)
    return os.WEXITSTATUS(code) if os.WIFEXITED(code) else -1


def _worker(fds: list[int]) -> None:
    """In the forked child: become a worker for one candidate, then leave (never return into the server)."""
    code = 70
    try:
        os.setsid()
        rfd, wfd, log = fds
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        from engine.run import impl_worker

        chan = impl_worker._Channel(rfd, wfd)
        init = chan.recv()
        code = 0 if init is None else impl_worker.serve(chan, init)
    except BaseException:  # noqa: BLE001 - whatever the candidate did, this process ends here
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt means
    ctrl = socket.socket(fileno=int(argv[0]))
    path = argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    from engine.run import sourceonly

    sourceonly.install()  # the methods this server imports (and its workers inherit) run from source
    from engine.run.impl_worker import import_harness

    import_harness()
    try:
        import torch._dynamo  # noqa: F401 - building an optimizer imports it: once here, not in every worker
    except ImportError:
        pass
    if len(argv) > 2:
        try:
            from engine.run.impl_loader import _framework

            _framework(argv[2]).preload()
        except Exception:  # noqa: BLE001 - each worker preloads again and reports a broken install in one line
            pass
    # Clear what was imported before the finder (sourceonly.check_loaded remembers it): each worker's runner
    # checks again, and without this every fork would resolve and compare thousands of modules afresh.
    sourceonly.install()
    gc.collect()
    gc.freeze()  # the workers' collections skip what was imported, so they do not copy its pages
    _send(ctrl, {"type": "ready", "pid": os.getpid()})
    owner: dict[int, socket.socket] = {}  # live worker pid -> the connection that asked for it
    conns = [ctrl]
    try:
        while conns:
            while owner:  # reap every worker that ended, and say how
                try:
                    pid, code = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    owner.clear()
                    break
                if pid == 0:
                    break
                conn = owner.pop(pid, None)
                if conn in conns:
                    _send(conn, {"type": "exit", "pid": pid, "status": _status(code)})
            ready, _, _ = select.select([listener, *conns], [], [], 0.05 if owner else 1.0)
            for sock in ready:
                if sock is listener:
                    try:
                        conn, _addr = listener.accept()
                    except OSError:
                        continue
                    conns.append(conn)
                    _send(conn, {"type": "ready", "pid": os.getpid()})
                    continue
                try:
                    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 3)
                except OSError:
                    data, fds = b"", []
                if not data:  # that process is gone or done: nobody will read its workers' answers
                    conns.remove(sock)
                    _kill([pid for pid, c in owner.items() if c is sock])
                    sock.close()
                    continue
                try:
                    msg = json.loads(data)
                except ValueError:
                    msg = {}
                if msg.get("type") != "spawn" or len(fds) != 3:
                    for fd in fds:
                        os.close(fd)
                    _send(sock, {"type": "refused", "id": msg.get("id"),
                                 "why": "not a spawn request with three descriptors"})
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for c in conns:
                        c.close()
                    _worker(fds)
                for fd in fds:
                    os.close(fd)
                owner[pid] = sock
                _send(sock, {"type": "spawned", "id": msg.get("id"), "pid": pid})
    finally:
        _kill(owner)
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
