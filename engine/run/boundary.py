"""The supervisor's side of the boundary: a candidate's functions called in the candidate's own process.

The checks, the references and the verdict run here; the candidate's functions run in a process that holds
the candidate, torch and a call loop (engine/run/call_loop.py, run as a file with `python -I`: nothing of the
engine). A check calls `impl.f(...)` as always; `impl` is an Implementation of `Remote` functions that send
the call across:

* in: the function's name and its arguments in the call loop's wire format (`pack`: a JSON line for the
  structure, the tensors' raw bytes after it; no pickle either way): tensors (detached), numbers, strings, None,
  dtypes, devices, and tuples, lists and dicts of them; a module of the checks (a policy) as a *handle* the
  candidate calls back (its number in `handles`), a dataclass (a rollout) as its fields; an argument of any other
  type cannot cross: `NotCrossable`, and the caller runs that contract where the candidate runs instead (the
  receipt lists it);
* call backs: a handle's call runs this process's own module on the tensors that crossed; a handle may also
  ask for a deep copy of its module (a new handle: how a candidate's `freeze` takes a snapshot) and set such a
  copy's mode and requires_grad, never those of an object the checks handed over (`_handle_request`);
* out: the return value, read with `unpack` (every tensor's dtype, shape and byte count checked) and
  accepted only as plain tensors, numbers, None, and tuples, lists and str-keyed dicts of them, or, from a
  function the interface declares to return a policy, a handle this process issued in the current check, read
  as the object it stands for; anything else is refused (the call's result is an error saying what came back);
* gradients: inputs that require grad are marked so on the other side, and the outputs that depend on them
  come back through `_Cross`, an autograd Function whose backward asks the candidate's process for the
  vector-Jacobian product of that same call (checked against the inputs' shapes);
* exceptions: (its first builtin type, message, the candidate's file:line) raised here as that type, so
  refusal contracts see a ValueError as a ValueError; a stub's NotImplementedError is noted at its line
  (engine/run/unimplemented.py); SystemExit and the like arrive as errors of that name, never as the real
  thing;
* every wait for the candidate has the call's deadline; past it, or when the process dies, the process is
  killed and the call is lost (`CandidateLost`).
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import itertools
import json
import math
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from engine.run import unimplemented
from engine.run.call_loop import HandleRef, Malformed, Record, Refused, pack, unpack
from engine.run.isolation import WorkerLost, exit_text, kill_group, log_tail, worker_env

LOOP = Path(__file__).with_name("call_loop.py")
MAX_HEADER = 1 << 16
MAX_PAYLOAD = 1 << 33  # what one frame may carry (8 GiB): past it, the candidate is lost, not the supervisor
MAX_CALLBACK = 1 << 28  # what one call back to the checks' objects may carry (256 MiB of arguments)
MAX_CALLBACK_OUT = 1 << 30  # what one call back's answer may hold (1 GiB)
MAX_CALLBACKS = 100_000  # call backs during one call
MAX_CALLBACK_TOKENS = 1 << 20  # integers (token ids) one call back may hand a policy: its forward's activations scale so
MAX_CALL_GROWTH = 4 << 30  # what the checks' process may grow by while serving one call's call backs (saved
# activations included): measured, since a graph's size is not known before the forward that builds it
ANSWER_FACTOR = 8  # an answer frame may hold this many times the bytes that crossed for its call, ...
ANSWER_SLACK = 64 << 20  # ... plus this: a schedule built from an integer, metrics, a scalar loss
MAX_STATES = 8  # a policy's recurrent states (a KV cache) kept for the candidate to pass back: the latest ones
STATE_KIND = "PolicyState"  # the kind its handle carries: an opaque token, neither callable nor copyable
MAX_COPIES = 2  # deep copies of the checks' objects a candidate may ask for during one call (a snapshot needs one)
_SCALARS = (type(None), bool, int, float, str, complex, torch.dtype, torch.device)


class NotCrossable(BaseException):
    """An argument of a type that does not cross (neither a tensor, number, module nor dataclass, nor a container
    of them): the contract runs beside the candidate.
    A BaseException, so a check's `except Exception` cannot count it as the candidate's refusal."""


class CandidateLost(BaseException):
    """The candidate's process died or missed its deadline: this call and its unit are lost."""


class ReturnRefused(TypeError):
    """The candidate returned something that does not cross (a string, an object)."""


_RAISED: dict[str, type] = {}


def _raised_class(name: str) -> type:
    """A RuntimeError subclass called `name`: how SystemExit, KeyboardInterrupt or an unknown type from the
    candidate arrives (its name in the message; never the real thing, which would stop the supervisor)."""
    if name not in _RAISED:
        _RAISED[name] = type(name, (RuntimeError,), {"__module__": "candidate"})
    return _RAISED[name]


def _printable(text: Any, limit: int) -> str:
    return "".join(ch for ch in str(text) if ch.isprintable())[:limit]


def exception_from(reply: dict) -> Exception:
    """The exception the candidate raised, as this process raises it: its builtin type (an Exception) with its
    message, `candidate_where` set to its file:line."""
    name = _printable(reply.get("type"), 60)
    message = str(reply.get("message"))[:4000]
    cls = getattr(builtins, name, None)
    exc: Exception
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not StopIteration:
        try:
            exc = cls(message)
        except Exception:  # noqa: BLE001 - a builtin that wants other arguments (UnicodeDecodeError)
            exc = _raised_class(name)(message)
    elif cls is StopIteration:
        exc = StopIteration(message) if message else StopIteration()
    else:
        exc = _raised_class(name or "Exception")(message)
    exc.candidate_where = _printable(reply.get("where") or "", 200)  # type: ignore[attr-defined]
    return exc


def _handle_attrs(obj: torch.nn.Module) -> dict:
    """What the candidate may read of a handle to a module: its plain attributes, and where its weights are."""
    attrs = {k: v for k, v in vars(obj).items() if not k.startswith("_") and type(v) in (bool, int, float, str)}
    first = next(iter(obj.parameters()), None)
    if first is not None:
        attrs["device"], attrs["dtype"] = first.device, first.dtype
    return attrs


def _encode(obj: Any, leaves: list, depth: int = 0, handles: list | None = None) -> Any:
    """`obj` as it crosses (tensors detached), its tensors appended to `leaves` in call_loop._tensors's order.
    A module crosses as a handle (appended to `handles`: the candidate calls it back), a dataclass as a record
    of its fields; neither where `handles` is None."""
    if depth > 32:
        raise NotCrossable("an argument nested more than 32 deep")
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise NotCrossable(f"a {type(obj).__name__} argument")
        leaves.append(obj)
        return obj.detach()
    if isinstance(obj, _SCALARS) and type(obj) in _SCALARS:
        return obj
    if type(obj) in (tuple, torch.Size):
        return tuple(_encode(x, leaves, depth + 1, handles) for x in obj)
    if type(obj) is list:
        return [_encode(x, leaves, depth + 1, handles) for x in obj]
    if type(obj) is dict and all(type(k) in (str, int) for k in obj):
        return {k: _encode(v, leaves, depth + 1, handles) for k, v in obj.items()}
    if handles is not None and isinstance(obj, torch.nn.Module):
        index = next((i for i, h in enumerate(handles) if h is obj), None)  # one handle per object
        if index is None:
            handles.append(obj)
            index = len(handles) - 1
        return HandleRef(index, type(obj).__name__, _handle_attrs(obj))
    if handles is not None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return Record(type(obj).__name__, {f.name: _encode(getattr(obj, f.name), leaves, depth + 1, handles)
                                           for f in dataclasses.fields(obj)})
    raise NotCrossable(f"a {type(obj).__name__} argument")


def _walk(obj: Any, out: list) -> list:
    """The tensors of a value in call_loop._tensors's order."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _walk(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _walk(x, out)
    return out


def _builtin_name(exc: BaseException) -> str:
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "RuntimeError"


def _accepted(obj: Any, where: str = "the return value", depth: int = 0) -> Any:
    """What came back, if it is what may come back: plain tensors, numbers, None, tuples, lists, str-keyed dicts."""
    if depth > 32:
        raise ReturnRefused(f"{where} is nested more than 32 deep")
    if type(obj) is torch.Tensor:
        return obj
    if type(obj) is torch.nn.Parameter:
        return obj.detach()
    if obj is None or type(obj) in (bool, int, float):
        return obj
    if type(obj) is tuple:
        return tuple(_accepted(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(obj))
    if type(obj) is list:
        return [_accepted(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(obj)]
    if type(obj) is dict and all(type(k) is str for k in obj):
        return {k: _accepted(v, f"{where}[{k!r}]", depth + 1) for k, v in obj.items()}
    if type(obj) is _Returned:
        raise ReturnRefused(f"{where} is a handle to the checks' {obj.kind}: only a function the interface declares "
                            "to return a policy gives one back, as its whole return value")
    raise ReturnRefused(f"{where} is a {type(obj).__name__}: only tensors, numbers, None, and tuples, lists and "
                        "dicts of them cross to the checks")


class _Returned:
    """A handle's number in a candidate's return value, as read here: `obj` is the object this process issued
    under that number in the current check, or None (gone at a reset, or never issued)."""

    __slots__ = ("index", "kind", "obj")

    def __init__(self, index: int, kind: str, obj: Any):
        self.index, self.obj = index, obj
        self.kind = type(obj).__name__ if obj is not None else _printable(kind, 60) or "object"


def _substitute(obj: Any, new: dict[int, torch.Tensor], counter: list) -> Any:
    """`obj` with its i-th tensor (walk order) replaced by new[i] where given."""
    if isinstance(obj, torch.Tensor):
        i = counter[0]
        counter[0] += 1
        return new.get(i, obj)
    if isinstance(obj, tuple):
        return tuple(_substitute(x, new, counter) for x in obj)
    if isinstance(obj, list):
        return [_substitute(x, new, counter) for x in obj]
    if isinstance(obj, dict):
        return {k: _substitute(v, new, counter) for k, v in obj.items()}
    return obj


def _issued(out: Any) -> Any:
    """The return value of a function declared to return a policy: a handle this process issued in this check,
    read as the object it stands for (the student itself, or a copy the candidate asked for)."""
    if type(out) is not _Returned:
        raise ReturnRefused(f"the return value is {'a ' + type(out).__name__ if out is not None else 'None'}: the "
                            "interface declares a policy, a handle the candidate was given or a copy of one")
    if out.obj is None:
        raise ReturnRefused(f"the return value is a handle to a {out.kind} the checks did not issue in this check (a "
                            "handle lasts for the check it came with)")
    return out.obj


def _pack(obj: Any) -> bytes:
    try:
        return pack(obj)
    except Refused as why:
        raise NotCrossable(str(why)) from None


ROWS_AFTER = 2  # the basis vector of an output asked for this many times: the whole Jacobian is fetched at once
MAX_ROW_ELEMENTS = 1 << 24  # a Jacobian fetched whole: at most this many entries (output x input elements)


class _Link:
    """One call's graph on the other side: what `_Cross.backward` asks about. A Jacobian taken row by row (one
    basis vector of an output per backward, as torch.autograd.functional.jacobian does) crosses once: after
    ROWS_AFTER such rows, every row of that output is asked for in one request (the call loop runs the same
    vector-Jacobian product for each), and the rest are read from it."""

    def __init__(self, conn: "Connection", cid: str, fn: str, outputs: list[torch.Tensor]):
        self.conn, self.cid, self.fn, self.outputs = conn, cid, fn, outputs
        self.basis_asked: dict[int, int] = {}  # output index -> one-hot backwards seen
        self.rows: dict[int, list] = {}  # output index -> per input: [output numel, *input shape] or None

    def vjp(self, grads: list, inputs: list) -> list:
        """The candidate's vector-Jacobian product for `grads` (one per output, None where none)."""
        hot = _one_hot(grads)
        if hot is None or self.conn.meter is not None:  # a budget's meter counts each backward as it is
            return self.conn.vjp(self.cid, self.fn, grads)
        j, k = hot
        if j not in self.rows:
            self.basis_asked[j] = self.basis_asked.get(j, 0) + 1
            n = grads[j].numel()
            if self.basis_asked[j] < ROWS_AFTER or n * sum(math.prod(s) for s, _, _ in inputs) > MAX_ROW_ELEMENTS:
                return self.conn.vjp(self.cid, self.fn, grads)
            self.rows[j] = self.conn.vjp_rows(self.cid, self.fn, j, grads[j], len(inputs))
        return [None if r is None else r[k] for r in self.rows[j]]


def _one_hot(grads: list) -> tuple[int, int] | None:
    """(output index, flat position) when `grads` is one basis vector: a single 1.0 in one output, every other
    entry exactly 0 or absent; else None."""
    found = None
    for j, g in enumerate(grads):
        if g is None:
            continue
        if not (g.is_floating_point() and g.numel()):
            return None
        nz = torch.count_nonzero(g)
        if nz == 0:
            continue
        if nz != 1 or found is not None:
            return None
        k = int(torch.argmax((g != 0).reshape(-1).to(torch.uint8)))
        if float(g.reshape(-1)[k]) != 1.0:
            return None
        found = (j, k)
    return found


class _Cross(torch.autograd.Function):
    """Outputs computed in the candidate's process, joined to this process's graph: backward is the candidate's
    vector-Jacobian product of the same call (once differentiable)."""

    @staticmethod
    def forward(ctx, link: _Link, *inputs: torch.Tensor):
        ctx.link = link
        ctx.inputs = [(t.shape, t.dtype, t.device) for t in inputs]
        ctx.set_materialize_grads(False)
        return tuple(link.outputs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        link = ctx.link
        got = link.vjp([None if g is None else g.detach() for g in grads], ctx.inputs)
        if not isinstance(got, list) or len(got) != len(ctx.inputs):
            raise ReturnRefused(f"{link.fn}: the candidate's vector-Jacobian product is not one gradient per input")
        out = []
        for g, (shape, dtype, device) in zip(got, ctx.inputs):
            if g is not None and (not isinstance(g, torch.Tensor) or g.shape != shape):
                raise ReturnRefused(f"{link.fn}: the candidate's gradient for an input of shape {list(shape)} has "
                                    f"shape {list(getattr(g, 'shape', []))}")
            out.append(None if g is None else g.to(device=device, dtype=dtype))
        if any(out[j] is not None for j in getattr(link, "into_handles", ())):  # the run's audit must see it
            link.conn.handle_gradients += 1
        return (None, *out)


def _to_device_of(target: Any, value: tuple, tensors: list) -> tuple:
    """The call back's (args, kwargs) with its tensors on the device of `target`'s parameters; integer tensors
    outside [0, target.vocab_size) refused (ValueError) before they can index an embedding."""
    params = next(iter(target.parameters()), None) if isinstance(target, torch.nn.Module) else None
    device = params.device if params is not None else torch.device("cpu")
    vocab = getattr(target, "vocab_size", None)
    for t in tensors:
        if type(vocab) is int and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool) \
                and t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab):
            raise ValueError(f"a token id outside [0, {vocab}) was passed to the policy")
    if device.type == "cpu":
        return value
    moved = {id(t): t.to(device) for t in tensors}

    def sub(x):
        if isinstance(x, torch.Tensor):
            return moved.get(id(x), x)
        if type(x) in (list, tuple):
            return type(x)(sub(v) for v in x)
        if type(x) is dict:
            return {k: sub(v) for k, v in x.items()}
        return x

    return sub(value)


def _memory_now(target: Any) -> int | None:
    """What the checks hold where `target` computes: allocated GPU memory for a module on a GPU, else resident."""
    first = next(iter(target.parameters()), None) if isinstance(target, torch.nn.Module) else None
    if first is not None and first.is_cuda:
        return torch.cuda.memory_allocated(first.device)
    return _resident_bytes()


def _resident_bytes() -> int | None:
    """This process's resident memory, from /proc (None where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _Stale:
    """A handle passed as a call back's argument that is not a live policy state."""

    def __init__(self, was_state: bool):
        self.was_state = was_state


def _refuse_stale_states(obj: Any, depth: int = 0) -> None:
    if isinstance(obj, _Stale):
        raise (RuntimeError(f"that policy state is gone: only the latest {MAX_STATES} are kept, for the check call "
                            "that made them") if obj.was_state else
               TypeError("only a policy's own state crosses back as an argument, not a handle to the checks' objects"))
    if type(obj) in (tuple, list) and depth < 40:
        for x in obj:
            _refuse_stale_states(x, depth + 1)
    elif type(obj) is dict and depth < 40:
        for x in obj.values():
            _refuse_stale_states(x, depth + 1)


TRANSPORT_COPIES = 3  # copies of a frame's bytes the call loop may hold at once while reading or writing it
TRANSPORT_SLACK = 64 << 20  # the interpreter's and allocator's own movement (a first metered call imports)


def _status_bytes(pid: int, key: str) -> int | None:
    """A `VmXXX:` line of /proc/PID/status in bytes (None where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key.encode() + b":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of the process so far (/proc/PID/stat, every thread), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _reset_peak(pid: int) -> int | None:
    """Reset the process's peak resident memory to its current one (/proc/PID/clear_refs, 5); that baseline, or
    None where the kernel does not let this process do it."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_bytes(pid, "VmRSS")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return out


class CandidateMeter:
    """`with remote_fn.metered() as meter:` the calls (and their vector-Jacobian calls) made meanwhile run under
    the call loop's allocation meter in the candidate's process; read `peak_bytes`, `ops` and `seconds` as the
    engine's AllocationMeter's. These are the candidate's process's own numbers, reported by it: a budget contract
    (its memory, its time) can be measured nowhere else, and the receipt says where it was (`measured_in`)."""

    measured_in = "candidate"

    def __init__(self, conn: "Connection"):
        self.conn = conn
        self.reports: dict[str, dict] = {}
        self.crossed = 0  # bytes of the frames the candidate's process read or wrote meanwhile (transport)
        self.outside_peak_bytes: int | None = None  # the kernel's reading, less the transport (None: none taken)
        self.outside_cpu_seconds: float | None = None  # the kernel's CPU time of the process meanwhile
        self._pid: int | None = None
        self._baseline: int | None = None

    def __enter__(self) -> "CandidateMeter":
        self.conn.meter = self
        self.conn.metered_entries += 1  # the result is marked measured_in: candidate whether or not a reading came
        # The supervisor's own reading, from outside: the candidate process's peak resident memory as the kernel
        # keeps it, its high-water mark reset here (before any frame of the call is sent)
        self._pid = self.conn.candidate_pid()
        self._baseline = _reset_peak(self._pid) if self._pid is not None else None
        self._cpu0 = _cpu_seconds(self._pid) if self._pid is not None else None
        return self

    def __exit__(self, *exc) -> None:
        self.conn.meter = None
        cpu = _cpu_seconds(self._pid) if self._pid is not None and self._cpu0 is not None else None
        if cpu is not None:  # the kernel's count of the process's CPU time (every thread), frames' handling included
            self.outside_cpu_seconds = max(0.0, cpu - self._cpu0)
        if self._pid is not None and self._baseline is not None:
            hwm = _status_bytes(self._pid, "VmHWM")
            if hwm is not None:
                # what moving the frames costs the call loop (a frame, its slices and the tensors' own bytes)
                # is not the function's: bounded by TRANSPORT_COPIES copies of every byte that crossed
                self.outside_peak_bytes = max(0, hwm - self._baseline - TRANSPORT_COPIES * self.crossed
                                              - TRANSPORT_SLACK)

    def note(self, cid: str, head: dict) -> None:
        got = head.get("metered")
        if not isinstance(got, dict):  # asked to meter, it sent no reading: zeros would pass every budget
            self.conn.lose("the candidate's process was asked to meter a call and sent no reading")
            raise CandidateLost(self.conn.lost)
        vals = {k: got.get(k) for k in ("peak_bytes", "ops", "seconds")}
        if not all(type(v) in (int, float) and v >= 0 and math.isfinite(v) for v in vals.values()):
            raise ReturnRefused("the candidate's process sent a meter reading that is not one")
        self.reports[cid] = vals  # a vjp's reading includes its call's (the same meter, cumulative)
        self.conn.metered_calls += 1

    @property
    def peak_bytes(self) -> int:
        return int(max((r["peak_bytes"] for r in self.reports.values()), default=0))

    @property
    def ops(self) -> int:
        return int(sum(r["ops"] for r in self.reports.values()))

    @property
    def seconds(self) -> float:
        return float(sum(r["seconds"] for r in self.reports.values()))


class Remote:
    """A candidate function, called across the boundary (same call signature; a generator function's calls
    return a RemoteIterator). `returns_handle`: the interface declares it returns a policy (MRTPO's `freeze`), so
    its return value is a handle, which means this process's own object it was issued for."""

    def __init__(self, conn: "Connection", name: str, returns_handle: bool = False):
        self.conn, self.name, self.returns_handle = conn, name, returns_handle
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.conn.call(self.name, args, kwargs, self.returns_handle)

    def metered(self) -> CandidateMeter:
        """A meter of the calls made while it is entered, taken by the call loop in the candidate's process."""
        return CandidateMeter(self.conn)

    def __repr__(self) -> str:
        return f"<candidate function {self.name}>"


class RemoteIterator:
    """The generator a candidate function returned, advanced in the candidate's process."""

    def __init__(self, conn: "Connection", cid: str, fn: str, leaves: list[torch.Tensor]):
        self.conn, self.cid, self.fn, self.leaves = conn, cid, fn, leaves
        self.k = itertools.count()

    def __iter__(self) -> "RemoteIterator":
        return self

    def __next__(self) -> Any:
        k = next(self.k)
        head = {"op": "next", "id": self.cid, "k": k, "grad_mode": torch.is_grad_enabled()}
        reply = self.conn.request(head, graded=self.leaves)  # call backs made for this item join its inputs
        return self.conn._answer(reply, self.fn, list(self.leaves), f"{self.cid}.{k}",
                                 n_args=getattr(self, "n_args", None))


class Connection:
    """The supervisor's end of one candidate process's pipes: load the candidate, call it, ask for VJPs."""

    def __init__(self, proc: subprocess.Popen, wfd: int, rfd: int, log, kill: Callable[[], None],
                 describe_exit: Callable[[int], str] | None = None):
        self.proc, self._w, self._r, self.log = proc, wfd, rfd, log
        self._kill = kill
        self._describe_exit = describe_exit
        self._buf = bytearray()
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.lost: str | None = None  # why the process is gone, once it is
        self.deadline: float | None = None  # an absolute end for every wait, where one is set
        self.deadline_s: float | None = None  # how long any one wait for the candidate may take
        self.not_crossable: str | None = None  # set when a call's argument could not cross
        self.refused: str | None = None  # set when a return value was refused
        self.ready = False  # the call loop said it has imported torch
        self.closed = False
        self.handles: list = []  # the checks' objects the candidate may call back (until the next reset)
        self.copies: set[int] = set()  # indices in `handles` of the deep copies the candidate asked for
        self.copies_in_call = 0  # deep copies made during the current request
        self.states: list[int] = []  # indices in `handles` of the live policy states, oldest first
        self.crossed: dict[str, int] = {}  # call id -> bytes that crossed for it (arguments and call backs' answers)
        self._answer_cid: str | None = None  # the call whose answer the current request waits for
        self._grew_from: int | None = None  # the checks' resident bytes when the current request began
        self.meter: CandidateMeter | None = None  # while set, calls run under the call loop's meter
        self.metered_calls = 0  # meter readings received
        self.metered_entries = 0  # contracts that ran calls under the call loop's meter
        self.callbacks = 0  # call backs served (the benchmark counts round trips)
        # backward calls whose vector-Jacobian product reached an output of a call back (a policy the checks hold):
        # the runner fails a contract where that happened and its runs audited no update (engine/run/run_audit.py)
        self.handle_gradients = 0

    # -- frames ---------------------------------------------------------------------------------

    def _send(self, head: dict, data: bytes = b"", end: float | None = None) -> None:
        # Non-blocking, by the call's deadline: a candidate that stops reading cannot hold the checks forever.
        msg = json.dumps(dict(head, n=len(data))).encode() + b"\n" + data
        view = memoryview(msg)
        try:
            if os.get_blocking(self._w):
                os.set_blocking(self._w, False)
            while view:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise WorkerLost("deadline")
                _, ready, _ = select.select([], [self._w], [], left)
                if not ready:
                    continue
                try:
                    n = os.write(self._w, view[:1 << 16])
                except BlockingIOError:
                    continue
                view = view[n:]
        except OSError as exc:
            raise WorkerLost(f"could not write to the candidate's process: {exc.strerror}") from None

    def _fill(self, want: int, end: float | None) -> None:
        while len(self._buf) < want:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerLost("deadline")
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise WorkerLost(self._death())
            self._buf += chunk

    def _recv(self, end: float | None) -> tuple[dict, bytes]:
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_HEADER:
                raise WorkerLost("the candidate's process sent a header that is too long")
            self._fill(len(self._buf) + 1, end)
        i = self._buf.index(b"\n")
        try:
            head = json.loads(bytes(self._buf[:i]))
        except ValueError:
            raise WorkerLost("the candidate's process sent something that is not a JSON header") from None
        if not isinstance(head, dict) or not isinstance(head.get("n", 0), int) or not 0 <= head.get("n", 0) <= \
                MAX_PAYLOAD:
            raise WorkerLost("the candidate's process sent a malformed header")
        n = head.get("n", 0)
        if head.get("op") == "callback" and n > MAX_CALLBACK:  # judged before its bytes are read
            raise WorkerLost(f"the candidate's process called back with more than {MAX_CALLBACK >> 20} MiB")
        cid = self._answer_cid
        if head.get("op") != "callback" and cid is not None:  # an answer: no larger than its call justifies
            bound = min(MAX_PAYLOAD, ANSWER_FACTOR * self.crossed.get(cid, 0) + ANSWER_SLACK)
            if n > bound:
                raise WorkerLost(f"the candidate's process answered with {n / 2**20:.0f} MiB where the call's inputs "
                                 f"justify at most {bound / 2**20:.0f} MiB (refused from its header, unread)")
        del self._buf[:i + 1]
        self._fill(n, end)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return head, data

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the candidate's process closed its pipe"
        how = self._describe_exit(code) if self._describe_exit else exit_text(code)
        tail = self.tail()
        return f"the candidate's process {how}" + (f" (last output: {tail})" if tail else "")

    def tail(self) -> str:
        return log_tail(self.log)

    def request(self, head: dict, data: bytes = b"", timeout: float | None = None,
                graded: list | None = None) -> tuple[dict, bytes]:
        """Send one request and wait for its answer, by the call's deadline (or `timeout`), serving the call backs
        the candidate makes meanwhile; their outputs that carry gradient are appended to `graded`."""
        with self._lock:
            if self.lost:
                raise CandidateLost(self.lost)
            self.copies_in_call = 0
            # each wait for the candidate has the call's deadline: the candidate's time, not the checks' here
            wait = timeout if timeout is not None else self.deadline_s
            end = time.monotonic() + wait if wait is not None else None
            if self.deadline is not None:
                end = self.deadline if end is None else min(end, self.deadline)
            try:
                self._answer_cid = head.get("id") if isinstance(head.get("id"), str) else None
                self._grew_from = None
                if self.meter is not None:
                    self.meter.crossed += len(data)
                self._send(head, data, end)
                served = [0, 0]  # call backs, bytes of their outputs kept for this call's gradient
                while True:
                    got = self._recv(end)
                    if self.meter is not None:
                        self.meter.crossed += len(got[1])
                    if got[0].get("op") != "callback":
                        return got
                    self._serve_callback(got[0], got[1], graded, end, served)
            except WorkerLost as exc:
                why = str(exc)
                if why == "deadline":
                    why = (f"the call ran past its deadline of {self.deadline_s or timeout or 0:g} s and the "
                           "candidate's process was killed")
                self.lose(why)
                raise CandidateLost(why) from None
            except BaseException:  # an interrupt or an alarm mid-call: the process is out of step, it goes
                self.lose("interrupted mid-call")
                raise

    def _serve_callback(self, head: dict, data: bytes, graded: list | None, end: float | None = None,
                        served: list | None = None) -> None:
        """The candidate called a handle: run the checks' own object on the tensors that crossed; answer with its
        outputs (those carrying gradient marked, and kept in `graded` for this call's vector-Jacobian product)."""
        index = head.get("h")
        if type(index) is not int:
            raise WorkerLost("the candidate's process called back something that is not a handle")
        if len(data) > MAX_CALLBACK:
            raise WorkerLost(f"the candidate's process called back with more than {MAX_CALLBACK >> 20} MiB")
        served = served if served is not None else [0, 0]
        served[0] += 1
        if served[0] > MAX_CALLBACKS:
            raise WorkerLost(f"the candidate's process called back more than {MAX_CALLBACKS} times in one call")
        try:
            value, tensors = unpack(data, device="cpu", returned=self._state_argument)
        except Exception as why:  # noqa: BLE001 - whatever it sent, it is not a call's arguments
            raise WorkerLost(f"the candidate's process called back with a malformed payload ({why})") from None
        if type(value) is not tuple or len(value) != 2 or type(value[0]) is not tuple or type(value[1]) is not dict \
                or not all(type(k) is str for k in value[1]):
            raise WorkerLost("the candidate's process called back with something other than (args, kwargs)")
        self.callbacks += 1
        do = head.get("do", "call")
        if do != "call":  # a handle's request other than a call: a deep copy, a copy's mode
            try:
                payload = pack(self._handle_request(index, do, value[0]))
            except Exception as exc:  # noqa: BLE001 - refused, or the copy failed: the candidate hears why
                self._send({"op": "raised", "type": _builtin_name(exc), "message": _printable(exc, 2000)}, end=end)
                return
            self._send({"op": "answer", "grad": []}, payload, end)
            return
        try:
            target = self.handles[index] if 0 <= index < len(self.handles) else None
            if target is None:
                raise RuntimeError("that object of the checks is gone: a handle lasts for the call it came with")
            if not isinstance(target, torch.nn.Module):
                raise TypeError("a policy's state is not callable: pass it back as the policy's `state` argument")
            _refuse_stale_states(value)
            ids = sum(t.numel() for t in tensors if not (t.is_floating_point() or t.is_complex()))
            if ids > MAX_CALLBACK_TOKENS:
                raise ValueError(f"a call back may pass at most {MAX_CALLBACK_TOKENS} token ids to the checks' "
                                 f"{type(target).__name__}, not {ids}: score the batch in pieces")
            if end is not None and time.monotonic() > end:
                raise WorkerLost("deadline")
            value = _to_device_of(target, value, tensors)
            if self._grew_from is None:  # the first call back of this request: where growth is counted from
                self._grew_from = _memory_now(target)
            with torch.set_grad_enabled(torch.is_grad_enabled() and head.get("grad_mode") is True):
                out = self._crossing_state(target(*value[0], **value[1]))
            outs = _walk(out, [])
            size = sum(t.numel() * t.element_size() for t in outs)
            if size > MAX_CALLBACK_OUT:
                raise ValueError(f"the answer would hold more than {MAX_CALLBACK_OUT >> 20} MiB")
            grew = self._growth(target)
            grad = [i for i, t in enumerate(outs) if t.requires_grad and (t.is_floating_point() or t.is_complex())]
            payload = pack(out)
        except WorkerLost:  # past the deadline: the candidate is out of time, not refused
            raise
        except Exception as exc:  # noqa: BLE001 - the checks' object refused the candidate's arguments
            self._send({"op": "raised", "type": _builtin_name(exc), "message": _printable(exc, 2000)}, end=end)
            return
        if end is not None and time.monotonic() > end:
            raise WorkerLost("deadline")
        if grew is not None:
            raise WorkerLost(grew)
        if self.meter is not None:
            self.meter.crossed += len(payload)
        if self._answer_cid is not None:  # what came back joins what the call's answer may be sized by
            self.crossed[self._answer_cid] = self.crossed.get(self._answer_cid, 0) + len(payload) + len(data)
        if graded is not None:
            served[1] += sum(outs[i].numel() * outs[i].element_size() for i in grad)
            if served[1] > MAX_PAYLOAD:  # the graphs kept for one call's gradient are bounded too
                raise WorkerLost(f"the candidate's call backs kept more than {MAX_PAYLOAD >> 30} GiB for one gradient")
            graded += [outs[i] for i in grad]
        else:
            grad = []
        self._send({"op": "answer", "grad": grad}, payload, end)

    def _handle_request(self, index: int, do: Any, args: tuple) -> Any:
        """What a handle may ask of the object it stands for besides a call: `deepcopy` (any object issued in
        this check; a new handle to the copy), `train` and `requires_grad_` with one bool (only on such a copy:
        the objects the checks handed over, the live student first, are not the candidate's to change)."""
        target = self.handles[index] if 0 <= index < len(self.handles) else None
        if target is None:
            raise RuntimeError("that object of the checks is gone: a handle lasts for the call it came with")
        kind = type(target).__name__
        if not isinstance(target, torch.nn.Module):
            raise TypeError(f"a policy's state is an opaque token: it does not {_printable(do, 40)!r}")
        if do == "deepcopy" and not args:
            self.copies_in_call += 1
            if self.copies_in_call > MAX_COPIES:
                raise ValueError(f"more than {MAX_COPIES} copies of the checks' objects asked for in one call")
            made = copy.deepcopy(target)
            self.handles.append(made)
            self.copies.add(len(self.handles) - 1)
            return HandleRef(len(self.handles) - 1, type(made).__name__, _handle_attrs(made))
        if do in ("train", "requires_grad_") and len(args) == 1 and type(args[0]) is bool:
            if index not in self.copies:
                raise PermissionError(f"the checks' {kind} is theirs: {do}() applies only to a copy made with "
                                      "copy.deepcopy(handle)")
            getattr(target, do)(args[0])
            return None
        raise TypeError(f"a handle to the checks' {kind} does not {_printable(do, 40)!r} with these arguments")

    def candidate_pid(self) -> int | None:
        """The host PID of the process running the call loop: this Popen's own, or, in a sandbox, the python
        process bubblewrap started (the deepest descendant; found once, when the call loop says it is ready and
        before the candidate is loaded)."""
        if getattr(self, "_candidate_pid", None) is None and self.proc.poll() is None:
            tree, i = [self.proc.pid], 0
            while i < len(tree) and len(tree) < 64:
                tree += _children(tree[i])
                i += 1
            self._candidate_pid = tree[-1]
        return getattr(self, "_candidate_pid", None)

    def _growth(self, target: Any) -> str | None:
        """Why serving this request's call backs has grown the checks' process too far (more than MAX_CALL_GROWTH
        since its first call back), or None: the saved activations of the graphs kept for the call's gradient
        count, which no size of the answers shows."""
        now = _memory_now(target)
        if now is None or self._grew_from is None or now - self._grew_from <= MAX_CALL_GROWTH:
            return None
        return (f"the candidate's call backs grew the checks by {(now - self._grew_from) / 2**30:.1f} GiB in one "
                f"call (at most {MAX_CALL_GROWTH >> 30} GiB, saved activations included)")

    def _crossing_state(self, out: Any) -> Any:
        """A policy's answer as it crosses: (logits, hidden, state) keeps its tensors, and a state that is not one (a
        Hugging Face model's KV cache) stays here, the candidate getting an opaque handle to pass back as `state`.
        Only the latest MAX_STATES live: an older one is gone, as its handle then says."""
        if type(out) is not tuple or len(out) != 3 or out[2] is None or isinstance(out[2], torch.Tensor):
            return out
        self.handles.append(out[2])
        self.states.append(len(self.handles) - 1)
        while len(self.states) > MAX_STATES:
            self.handles[self.states.pop(0)] = None
        return (out[0], out[1], HandleRef(self.states[-1], STATE_KIND, {}))

    def _state_argument(self, index: int, kind: str) -> Any:
        """A handle in a call back's arguments: a policy state this process kept, or `_Stale`: the call is refused
        (the candidate hears why) rather than the checks' object being read as one of its arguments."""
        if kind == STATE_KIND and index in self.states and self.handles[index] is not None:
            return self.handles[index]
        return _Stale(index in self.states or kind == STATE_KIND)

    def lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
        self.kill()

    def kill(self) -> None:
        if not self.closed:
            self._kill()

    # -- the candidate ----------------------------------------------------------------------------

    def load(self, init: dict, startup_s: float, load_s: float | None = None) -> dict:
        """Send the candidate's init; the `loaded` or `load_error` answer. `startup_s` bounds the whole start
        (the interpreter importing torch, then the candidate); `load_s`, once torch is imported, the candidate's
        own import: it is the candidate's time, held to the call deadline (--impl-timeout)."""
        return self._init(init, startup_s, load_s)[0]

    def wait_ready(self, timeout: float) -> bool:
        """Block until the process has imported torch (a spare's imports), or it died, or `timeout` passed."""
        with self._lock:
            if self.ready:
                return True
            try:
                head, _ = self._recv(time.monotonic() + timeout)
            except WorkerLost as exc:
                if str(exc) != "deadline":
                    self.lose(str(exc))
                return False
            if head.get("op") != "ready":
                self.lose("the candidate's process did not start the call loop")
                return False
            self.ready = True
            return True

    def _init(self, init: dict, startup_s: float, load_s: float | None = None) -> tuple[dict, bytes]:
        end = time.monotonic() + startup_s
        loading = False
        with self._lock:
            try:
                if not self.ready:
                    head, _ = self._recv(end)
                    if head.get("op") != "ready":
                        raise WorkerLost("the candidate's process did not start the call loop")
                    self.ready = True
                    # which process is measured from outside is fixed now, before the candidate's code runs: found
                    # later, a child it forked at import would be the deepest descendant, and be measured instead
                    self.candidate_pid()
                if load_s is not None:
                    end, loading = min(end, time.monotonic() + load_s), True
                self._send(dict(init, op="init"))
                return self._recv(end)
            except WorkerLost as exc:
                why = str(exc)
                if why == "deadline":
                    why = (f"the candidate did not finish loading within {load_s:g} s (the call deadline, "
                           "--impl-timeout, covers its import)" if loading else f"no answer within {startup_s:g} s")
                self.lose(why)
                raise WorkerLost(why) from None

    def call(self, fn: str, args: tuple, kwargs: dict, returns_handle: bool = False) -> Any:
        grad_mode = torch.is_grad_enabled()
        leaves: list[torch.Tensor] = []
        try:
            payload = _encode((tuple(args), dict(kwargs)), leaves, handles=self.handles)
        except NotCrossable as why:
            self.not_crossable = self.not_crossable or f"{fn}: {why} does not cross to the candidate's process"
            raise
        need = [i for i, t in enumerate(leaves) if grad_mode and t.requires_grad]
        cid = str(next(self._ids))
        self.crossed[cid] = sum(t.numel() * t.element_size() for t in leaves)
        head = {"op": "call", "id": cid, "fn": fn, "grad": need, "grad_mode": grad_mode}
        if self.meter is not None:
            head["meter"] = True
        graded = [leaves[i] for i in need]
        reply = self.request(head, _pack(payload), graded=graded)
        return self._answer(reply, fn, graded if reply[0].get("op") == "iter" else list(graded), cid, returns_handle,
                            len(need))

    def _returned(self, index: int, kind: str) -> _Returned:
        """A handle's number in a return value: the object issued under it in this check, if any."""
        return _Returned(index, kind, self.handles[index] if 0 <= index < len(self.handles) else None)

    def _answer(self, reply: tuple[dict, bytes], fn: str, grad_inputs: list[torch.Tensor], cid: str,
                returns_handle: bool = False, n_args: int | None = None) -> Any:
        head, data = reply
        op = head.get("op")
        if op == "raised":
            exc = exception_from(head)
            if head.get("stub") is True and isinstance(exc, NotImplementedError):
                unimplemented.noted(fn, getattr(exc, "candidate_where", "") or "?")
            raise exc
        if op == "refused":
            self.refused = self.refused or _printable(head.get("message"), 400)
            raise ReturnRefused(self.refused)
        if op == "iter" and returns_handle:
            self.refused = self.refused or f"{fn}: the return value is a generator: the interface declares a policy"
            raise ReturnRefused(self.refused)
        if op == "iter":
            it = RemoteIterator(self, cid, fn, grad_inputs)
            it.n_args = n_args  # grad_inputs past the call's own arguments are call backs' outputs
            return it
        if op != "ok":
            self.lose(f"the candidate's process answered {_printable(op, 40)!r} to a call")
            raise CandidateLost(self.lost)
        if self.meter is not None:
            self.meter.note(cid, head)
        try:
            out, outs = unpack(data, returned=self._returned)
        except Malformed as why:  # whatever it sent, it is not this format
            self.refused = self.refused or f"{fn}: the return value is not a payload of tensors ({why})"
            raise ReturnRefused(self.refused) from None
        try:
            if returns_handle:
                return _issued(out)
            out = _accepted(out)
        except ReturnRefused as why:
            self.refused = self.refused or f"{fn}: {why}"
            raise ReturnRefused(self.refused) from None
        diff = head.get("diff") or []
        if not grad_inputs or not diff:
            return out
        if not isinstance(diff, list) or not all(isinstance(j, int) and 0 <= j < len(outs) for j in diff) or \
                len(set(diff)) != len(diff):
            self.lose(f"{fn}: the candidate's process named outputs it did not return")
            raise CandidateLost(self.lost)
        used = head.get("inputs")
        if used is None:
            used = list(range(len(grad_inputs)))
        if not isinstance(used, list) or not all(isinstance(i, int) and 0 <= i < len(grad_inputs) for i in used) or \
                len(set(used)) != len(used):
            self.lose(f"{fn}: the candidate's process named inputs it was not given")
            raise CandidateLost(self.lost)
        pick = [j for j in diff if outs[j].is_floating_point() or outs[j].is_complex()]
        if not pick or not used:
            return out
        link = _Link(self, cid, fn, [outs[j] for j in pick])
        link.into_handles = [j for j, i in enumerate(used) if n_args is not None and i >= n_args]
        joined = _Cross.apply(link, *[grad_inputs[i] for i in used])
        return _substitute(out, dict(zip(pick, joined)), [0])

    def vjp(self, cid: str, fn: str, grads: list) -> Any:
        meter = self.meter if self.meter is not None and cid in self.meter.reports else None
        head, data = self.request({"op": "vjp", "id": cid, **({"meter": True} if meter else {})}, _pack(grads))
        if meter is not None and head.get("op") == "ok":
            meter.note(cid, head)
        if head.get("op") == "raised":
            raise exception_from(head)
        if head.get("op") != "ok":
            raise ReturnRefused(f"{fn}: the candidate's process did not answer the vector-Jacobian call")
        try:
            return _accepted(unpack(data)[0], "the gradient")
        except (Malformed, ReturnRefused) as exc:
            raise ReturnRefused(f"{fn}: the candidate's gradient is not a list of tensors ({exc})") from None

    def vjp_rows(self, cid: str, fn: str, j: int, like: torch.Tensor, n_inputs: int) -> list:
        """Every row of the Jacobian of output `j` of call `cid` in one request: per input, a tensor [numel of
        output j, *input shape] (row k: the vector-Jacobian product for the k-th basis vector), or None."""
        n = like.numel()
        head, data = self.request({"op": "vjp", "id": cid, "rows": j}, _pack([like.new_zeros(())]))
        if head.get("op") == "raised":
            raise exception_from(head)
        if head.get("op") != "ok":
            raise ReturnRefused(f"{fn}: the candidate's process did not answer the vector-Jacobian call")
        try:
            got = _accepted(unpack(data)[0], "the gradient")
        except (Malformed, ReturnRefused) as exc:
            raise ReturnRefused(f"{fn}: the candidate's gradient is not a list of tensors ({exc})") from None
        if not isinstance(got, list) or len(got) != n_inputs or any(
                g is not None and (not isinstance(g, torch.Tensor) or g.dim() < 1 or g.shape[0] != n) for g in got):
            raise ReturnRefused(f"{fn}: the candidate's Jacobian rows are not {n} per input")
        return got

    def reset(self) -> None:
        """Between check calls: the candidate drops every graph and generator it kept."""
        with self._lock:
            # Emptied, not cleared: a handle kept past its check must reach nothing, not the next check's object
            # at the same index.
            self.handles[:] = [None] * len(self.handles)
            self.copies.clear()
            self.states.clear()
            self.crossed.clear()
            if self.lost is None:
                try:
                    self._send({"op": "reset"})
                except WorkerLost as exc:
                    self.lose(str(exc))

    def close(self, kill: bool = False) -> None:
        if self.closed:
            return
        if not kill and self.lost is None and self.proc.poll() is None:
            try:
                self._send({"op": "stop"})
                self.proc.wait(timeout=5)
            except (WorkerLost, subprocess.TimeoutExpired):
                pass
        self._kill()
        self.closed = True
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.log.close()
        except OSError:
            pass




def pipes() -> tuple[int, int, int, int]:
    """(child reads, we write, we read, child writes)."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    return to_r, to_w, from_r, from_w


def spawn(argv_for: Callable[[int, int], list[str]], env: dict[str, str],
          describe_exit: Callable[[int], str] | None = None) -> Connection:
    """Start a candidate process (the call loop, bare or inside a sandbox) and connect to it."""
    to_r, to_w, from_r, from_w = pipes()
    log = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(argv_for(to_r, from_w), pass_fds=(to_r, from_w), env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)  # its own group: killed whole, no Ctrl-C
    finally:
        os.close(to_r)
        os.close(from_w)

    def kill() -> None:
        if proc.poll() is None:
            kill_group(proc)  # the candidate's own children too
        else:
            proc.wait()

    return Connection(proc, to_w, from_r, log, kill, describe_exit)


def plain(device: str = "cpu") -> Connection:
    """An unsandboxed candidate process (`--no-sandbox`): the call loop in isolated mode, the allow-listed
    environment; the same boundary, without bubblewrap."""
    del device
    return spawn(lambda r, w: [sys.executable, "-I", str(LOOP), str(r), str(w)], worker_env())


def implementation(conn: Connection, name: str, names: list[str], returns: set[str] = frozenset()):
    """An engine Implementation whose functions are the candidate's, called across the boundary (those in
    `returns` are declared to return a policy: their return value is a handle, read as this process's object)."""
    from engine.spec.registry import Implementation

    return Implementation(name, **{n: Remote(conn, n, n in returns) for n in names})


Connection.implementation = implementation  # type: ignore[attr-defined] - what engine/run/isolation.py calls


__all__ = ["CandidateLost", "CandidateMeter", "Connection", "NotCrossable", "Remote", "RemoteIterator", "ReturnRefused",
           "exception_from", "implementation", "plain", "spawn"]
