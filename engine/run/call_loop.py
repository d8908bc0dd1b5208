"""The candidate's side of the boundary: `python -I call_loop.py RFD WFD`, the only code beside the candidate.

The candidate's process holds the candidate, torch and this loop: it imports the standard library and torch,
never the engine or the methods (it is run as a file, in isolated mode, so not even the checkout is on its
path), so whatever the candidate looks for or patches in its own process, the checks, references and verdict
are not there: they run in the supervisor (engine/run/boundary.py), which calls the candidate's functions
through this loop.

Frames both ways are one JSON header line (`n`: the length of what follows) and `n` bytes of payload: a JSON
line for the structure and the tensors' raw bytes (`pack`, `unpack`; the supervisor reads them with the same
functions). No pickle in either direction, so nothing sent from here can run code there.

  out  ready (torch imported: a spare waits here for its candidate)
  in   init {target, names, device, threads, memory_mb, cwd, env}        -> loaded {missing, not_callable, note}
                                                                          or load_error {message, fatal}
       call {id, fn, grad: [input tensor indices], grad_mode} + (args, kwargs)
                                                                       -> ok {diff: [output tensor indices]}
                                                                          + result, or iter {} (a generator),
                                                                          or raised {type, message, where, stub}
       next {id} (the next item of generator `id`)                     -> ok ... / raised StopIteration
       vjp {id} + [gradient per differentiable output, or None]        -> ok + [gradient per input, or None]
       (a call or vjp with `meter`: run under this loop's own allocation meter; the answer adds
        metered {peak_bytes, ops, seconds}, the call and its vjp counted together)
       reset (drop every graph and generator)                          ; stop
  out  (during a call or next) callback {h, grad_mode} + (args, kwargs)  -> answer {grad: [output tensor indices]}
                                                                          + result, or raised {type, message}
       (during a call or next) callback {h, do} + ((arg,), {})          -> answer + a handle to a copy (do: deepcopy)
                                                                          or None (do: train, requires_grad_)

A call's argument that is an object of the checks (a policy module) crosses as a handle: calling it here sends
a callback to the supervisor, which runs its own object on the tensors that crossed and answers with tensors;
outputs that carry its gradient are marked, join the call's inputs here, and the vector-Jacobian call returns
their gradients too (so a loss computed here from a policy's logits trains the supervisor's policy). A handle
can also ask the supervisor for a deep copy of its object (a new handle) and set a copy's mode and
requires_grad (`Handle`); the supervisor refuses those on the objects it handed over. In a return value a
handle crosses as its number: the supervisor maps it back to its own object where the function is declared to
return one and the number is one it issued in this check, and refuses it otherwise. A record of the checks (a
rollout) crosses as a namespace of its fields and never comes back: the supervisor's reader knows no such tag.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import inspect
import json
import os
import re
import signal
import sys
import traceback
from pathlib import Path

MAX_HEADER = 1 << 16
MAX_GRAPHS = 64  # graphs kept for a later VJP (a check's backward comes soon after its forward)
_HERE = os.path.abspath(__file__)


class Refused(Exception):
    """A value this loop will not send (not a tensor, number, handle, or tuple, list or dict of them)."""


class HandleRef:
    """In `pack`: one of the supervisor's objects (a policy module) by number, with the plain attributes the
    candidate may read (`attrs`: numbers, strings, bools). Only the supervisor writes these."""

    def __init__(self, index: int, kind: str, attrs: dict):
        self.index, self.kind, self.attrs = index, kind, attrs


class Record:
    """In `pack`: a record of the checks (a dataclass such as a rollout) as its named fields."""

    def __init__(self, kind: str, fields: dict):
        self.kind, self.fields = kind, fields


class Handle:
    """The candidate's view of one of the checks' objects (a policy module): calling it asks the supervisor to call
    its own object on these arguments (tensors cross both ways); its plain attributes are readable. Besides that,
    only what a frozen snapshot needs, each asked of the supervisor, which decides:

    * `copy.deepcopy(handle)`: the supervisor deep-copies its object and answers with a handle to the copy;
    * `eval()`, `train(mode)`, `requires_grad_(flag)` on such a copy (never on an object the checks handed over:
      the live student is theirs), returning the handle as torch's own do;
    * returned as the result of a function the interface declares to return a policy (`freeze`), it means the
      supervisor's object it stands for, if the supervisor issued it in this check.

    Its weights never come here: `parameters()`, `state_dict()`, attribute writes and `copy.copy` are refused."""

    def __init__(self, call, index: int, kind: str, attrs: dict, ask=None):
        object.__setattr__(self, "_call", call)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_attrs", dict(attrs))
        object.__setattr__(self, "_ask", ask)

    def __call__(self, *args, **kwargs):
        return self._call(self._index, args, kwargs)

    def __getattr__(self, name):
        attrs = object.__getattribute__(self, "_attrs")
        if name in attrs:
            return attrs[name]
        raise AttributeError(f"the caller's {object.__getattribute__(self, '_kind')} is a handle here: call it "
                             f"with tensors, copy.deepcopy it, and eval(), train() or requires_grad_() the copy; "
                             f"of its attributes only {sorted(attrs) or 'none'} are readable, not {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError("the caller's objects are read-only here")

    def __delattr__(self, name):
        raise AttributeError("the caller's objects are read-only here")

    def _do(self, what: str, *args):
        ask = object.__getattribute__(self, "_ask")
        if ask is None:
            raise AttributeError(f"the caller's {self._kind} is a handle here: it can only be called")
        return ask(self._index, what, args)

    def __deepcopy__(self, memo):
        """A frozen snapshot's first step: the supervisor copies its object; a handle to the copy comes back."""
        return self._do("deepcopy")

    def __copy__(self):
        raise TypeError(f"the caller's {self._kind} is a handle here: a shallow copy would share its parameters; "
                        "copy.deepcopy(handle) asks for a copy of its own")

    def __reduce_ex__(self, protocol):
        raise TypeError(f"the caller's {self._kind} is a handle here: it does not pickle")

    def eval(self):
        return self.train(False)

    def train(self, mode: bool = True):
        self._do("train", mode)
        attrs = object.__getattribute__(self, "_attrs")
        if "training" in attrs:  # what it reads of the copy stays true
            attrs["training"] = bool(mode)
        return self

    def requires_grad_(self, requires_grad: bool = True):
        self._do("requires_grad_", requires_grad)
        return self

    def __repr__(self):
        return f"<handle to the caller's {self._kind}>"


def _tensors(obj, out: list) -> list:
    """The tensors of a nested value, in the order both sides walk it (engine/run/boundary.py:_walk)."""
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out)
    return out


def _plain(obj, where: str = "the return value", depth: int = 0):
    """`obj` as what may cross: plain tensors (detached), numbers, None, and tuples, lists and str-keyed dicts."""
    import torch

    if depth > 32:
        raise Refused(f"{where} is nested more than 32 deep")
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t if type(t) is torch.Tensor else t.as_subclass(torch.Tensor)
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, tuple):
        return tuple(_plain(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(obj))
    if isinstance(obj, list):
        return [_plain(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(obj)]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise Refused(f"{where} is a dict with keys that are not strings")
        return {k: _plain(v, f"{where}[{k!r}]", depth + 1) for k, v in obj.items()}
    if type(obj) is Handle:  # by number: the supervisor decides whether this function may give one back
        return HandleRef(object.__getattribute__(obj, "_index"), object.__getattribute__(obj, "_kind"), {})
    raise Refused(f"{where} is a {type(obj).__name__}: only tensors, numbers, None, and tuples, lists and dicts "
                  "of them cross to the checks")


class Channel:
    def __init__(self, rfd: int, wfd: int):
        self._in = os.fdopen(rfd, "rb")
        self._out = os.fdopen(wfd, "wb", buffering=0)

    def recv(self):
        line = self._in.readline(MAX_HEADER + 1)
        if not line.endswith(b"\n"):
            return None, b""
        head = json.loads(line)
        n = int(head.get("n") or 0)
        data = self._in.read(n) if n else b""
        if len(data) != n:
            return None, b""
        return head, data

    def send(self, head: dict, data: bytes = b"") -> None:
        self._out.write(json.dumps(dict(head, n=len(data))).encode() + b"\n" + data)


# --- the wire format: JSON for the structure, raw bytes for the tensors; no pickle in either direction ---------

DTYPES = ("float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int64", "int32", "int16", "int8",
          "uint8", "bool")
_DEVICE = re.compile(r"^(cpu|cuda(:[0-9]{1,3})?)$")
MAX_DEPTH = 32


class Malformed(ValueError):
    """A payload that is not this format: the other side is lost, never trusted."""


def pack(obj) -> bytes:
    """`obj` as one payload: a JSON line (tensors as {"t": i}, with dtype, shape, device and byte count) and the
    tensors' bytes after it. Tuples, dicts (str or int keys), strings, dtypes, devices and complex numbers are
    tagged so they come back as themselves."""
    import torch

    metas: list = []
    raws: list = []

    def enc(x, depth):
        if depth > MAX_DEPTH:
            raise Refused(f"a value nested more than {MAX_DEPTH} deep")
        if isinstance(x, torch.Tensor):
            t = x.detach()
            dev = str(t.device)
            t = t.to("cpu").contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            metas.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "device": dev,
                          "n": len(raw)})
            raws.append(raw)
            return {"t": len(metas) - 1}
        if x is None or isinstance(x, (bool, int, float)) and type(x) in (bool, int, float):
            return x
        if isinstance(x, str) and type(x) is str:
            return {"s": x}
        if isinstance(x, complex):
            return {"c": [x.real, x.imag]}
        if isinstance(x, torch.dtype):
            return {"dt": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"dv": str(x)}
        if type(x) is list:
            return [enc(v, depth + 1) for v in x]
        if isinstance(x, tuple):
            return {"T": [enc(v, depth + 1) for v in x]}
        if type(x) is dict:
            return {"D": [[k if type(k) in (str, int) else _bad_key(k), enc(v, depth + 1)] for k, v in x.items()]}
        if type(x) is HandleRef:
            return {"H": [x.index, str(x.kind), enc(x.attrs, depth + 1)]}
        if type(x) is Handle:  # a candidate passing back what the supervisor gave it (a policy's state): by number
            return {"H": [object.__getattribute__(x, "_index"), str(object.__getattribute__(x, "_kind")), {"D": []}]}
        if type(x) is Record:
            return {"R": [str(x.kind), enc(x.fields, depth + 1)]}
        raise Refused(f"a {type(x).__name__} does not cross")

    tree = enc(obj, 0)
    return json.dumps({"tree": tree, "tensors": metas}).encode() + b"\n" + b"".join(raws)


def _bad_key(k):
    raise Refused(f"a dict key of type {type(k).__name__} does not cross")


def unpack(data: bytes, handle=None, device: str | None = None, returned=None):
    """(the value, its tensors in the order they were packed) from `pack`'s bytes; Malformed if it is not that.
    Handles and records are read only where `handle` is given (the call loop's side: `handle(index, kind, attrs)`
    makes the candidate's view). The supervisor's reader gives none: no record comes back to it, and a handle only
    where it gives `returned` (`returned(index, kind)`: what it makes of a handle's number in a return value).
    With `device`, every tensor lands there, whatever device its description names (a call back's arguments)."""
    import torch

    end = data.find(b"\n")
    if end < 0:
        raise Malformed("no structure line")
    try:
        head = json.loads(data[:end])
    except ValueError:
        raise Malformed("the structure line is not JSON") from None
    if not isinstance(head, dict) or not isinstance(head.get("tensors"), list):
        raise Malformed("the structure line is not a payload's")
    tensors = []
    off = end + 1
    for m in head["tensors"]:
        if not isinstance(m, dict) or m.get("dtype") not in DTYPES or not isinstance(m.get("shape"), list) or \
                not all(type(d) is int and d >= 0 for d in m["shape"]) or not isinstance(m.get("n"), int) or \
                not isinstance(m.get("device"), str) or not _DEVICE.match(m["device"]):
            raise Malformed("a tensor's description is not one")
        dtype = getattr(torch, m["dtype"])
        numel = 1
        for d in m["shape"]:
            numel *= d
        size = torch.empty((), dtype=dtype).element_size()
        if m["n"] != numel * size or off + m["n"] > len(data):
            raise Malformed("a tensor's bytes do not match its shape")
        if numel:
            t = torch.frombuffer(bytearray(data[off:off + m["n"]]), dtype=torch.uint8).view(dtype).reshape(m["shape"])
        else:
            t = torch.empty(m["shape"], dtype=dtype)
        off += m["n"]
        where = device or m["device"]
        tensors.append(t if where == "cpu" else t.to(where))
    if off != len(data):
        raise Malformed("bytes left over after the tensors")

    def dec(x, depth):
        if depth > MAX_DEPTH:
            raise Malformed("nested too deep")
        if x is None or type(x) in (bool, int, float):
            return x
        if type(x) is list:
            return [dec(v, depth + 1) for v in x]
        if type(x) is dict and len(x) == 1:
            (tag, v), = x.items()
            if tag == "t" and type(v) is int and 0 <= v < len(tensors):
                return tensors[v]
            if tag == "T" and type(v) is list:
                return tuple(dec(e, depth + 1) for e in v)
            if tag == "D" and type(v) is list and all(type(e) is list and len(e) == 2 and type(e[0]) in (str, int)
                                                      for e in v):
                return {e[0]: dec(e[1], depth + 1) for e in v}
            if tag == "s" and type(v) is str:
                return v
            if tag == "c" and type(v) is list and len(v) == 2 and all(type(e) in (int, float) for e in v):
                return complex(v[0], v[1])
            if tag == "dt" and v in DTYPES:
                return getattr(torch, v)
            if tag == "dv" and type(v) is str and _DEVICE.match(v):
                return torch.device(v)
            if handle is not None and tag == "H" and type(v) is list and len(v) == 3 and type(v[0]) is int and \
                    type(v[1]) is str:
                attrs = dec(v[2], depth + 1)
                if type(attrs) is dict:
                    return handle(v[0], v[1], attrs)
            if handle is None and returned is not None and tag == "H" and type(v) is list and len(v) == 3 and \
                    type(v[0]) is int and type(v[1]) is str:
                return returned(v[0], v[1])
            if handle is not None and tag == "R" and type(v) is list and len(v) == 2 and type(v[0]) is str:
                import types

                fields = dec(v[1], depth + 1)
                if type(fields) is dict and all(type(k) is str and k.isidentifier() for k in fields):
                    return types.SimpleNamespace(**fields)
        raise Malformed("a value of the structure is not one this format writes")

    return dec(head.get("tree"), 0), tensors


def _builtin(exc: BaseException) -> str:
    """The first builtin exception class among `exc`'s: what the supervisor raises in its place."""
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "Exception"


def _where(exc: BaseException, root: str) -> str:
    """`file.py:line` of the innermost frame in the candidate's own files (else the innermost but this loop's)."""
    frames = [fr for fr in traceback.extract_tb(exc.__traceback__) if os.path.abspath(fr.filename) != _HERE]
    own = [fr for fr in frames if os.path.abspath(fr.filename).startswith(root + os.sep)]
    fr = (own or frames or [None])[-1]
    return f"{Path(fr.filename).name}:{fr.lineno}" if fr is not None else ""


def _raised(exc: BaseException, root: str, own_file: str | None) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    # a stub's NotImplementedError: raised by the function's own code (engine/run/unimplemented.py's rule)
    stub = isinstance(exc, NotImplementedError) and bool(frames) and frames[-1].filename == own_file
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = "(its message could not be read)"
    return {"op": "raised", "type": _builtin(exc), "message": text[:4000], "where": _where(exc, root), "stub": stub}


_METER: list = []


def _meter_class():
    """The allocation meter, built on first use (TorchDispatchMode is torch's; a spare need not import it)."""
    if _METER:
        return _METER[0]
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def tensors(x, out):
        # not torch's pytree walk: it runs for every operation, and costs more than most of them
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                tensors(y, out)
        return out

    class Meter(TorchDispatchMode):
        """Peak bytes of tensor storage created and not yet freed inside the block, and ATen operations dispatched:
        a budget contract's measurement of the candidate's own call, taken here because it exists only here
        (the same counting as the engine's meter, engine/kinds/meter.py, which this process does not import)."""

        def __init__(self):
            super().__init__()
            self.current_bytes = self.peak_bytes = self.ops = 0
            self.seconds = 0.0
            self._live: dict = {}
            self._external: set = set()
            self._refs: dict = {}  # by id: a tensor's weak reference compares as the tensor does

        def _release(self, ptr):
            entry = self._live.get(ptr)
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0:
                    self.current_bytes -= entry[0]
                    del self._live[ptr]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            self.ops += 1
            found = tensors(args, [])
            for v in kwargs.values():
                tensors(v, found)
            live, external, refs, release = self._live, self._external, self._refs, self._release
            for t in found:
                ptr = t.untyped_storage().data_ptr()
                if ptr and ptr not in live:
                    external.add(ptr)
            out = func(*args, **kwargs)
            for t in tensors(out, []):
                st = t.untyped_storage()
                ptr, nbytes = st.data_ptr(), st.nbytes()
                if ptr == 0 or nbytes == 0 or ptr in external:
                    continue
                entry = live.get(ptr)
                if entry is None:
                    entry = live[ptr] = [nbytes, 0]
                    self.current_bytes += nbytes
                    self.peak_bytes = max(self.peak_bytes, self.current_bytes)
                entry[1] += 1

                def dead(ref, ptr=ptr):
                    refs.pop(id(ref), None)
                    release(ptr)

                ref = weakref.ref(t, dead)
                refs[id(ref)] = ref
            return out

        def report(self) -> dict:
            return {"peak_bytes": int(self.peak_bytes), "ops": int(self.ops), "seconds": float(self.seconds)}

    _METER.append(Meter)
    return Meter


def _metered(meter, fn):
    """fn() under `meter` (ATen counts, and the CUDA allocator's peak where the call ran on a GPU)."""
    import time

    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with meter:
        out = fn()
    if cuda:
        torch.cuda.synchronize()
        meter.peak_bytes = max(meter.peak_bytes, torch.cuda.max_memory_allocated() - before)
    meter.seconds += time.perf_counter() - start
    return out


def _limit_memory(extra_mb) -> str | None:
    """Cap the address space at what the imports mapped plus `extra_mb` (an unbounded allocation then fails
    inside the call, and crosses as a MemoryError or RuntimeError)."""
    if not extra_mb:
        return None
    try:
        import resource
    except ImportError:
        return "no resource module: memory is not limited"
    vm = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                vm = int(line.split()[1]) * 1024
    except OSError:
        pass
    cap = vm + int(extra_mb) * 1024 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    # soft and hard alike: a candidate may lower its limits, never raise them back
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return None


FILE_LIMIT = 64 << 20  # the largest file the candidate may write: its stdout and stderr are files of the checks
OPEN_FILES = 256  # descriptors: torch's imports hold a few dozen


def _hard_limits() -> None:
    """Limits the candidate cannot raise (soft = hard), set before its code runs, whatever the device: the size of
    any file it writes (its stdout and stderr go to a file of the checks: a flood past this kills it with SIGXFSZ
    rather than filling the host's disk), open descriptors, no core dumps. Threads and processes are not capped by
    RLIMIT_NPROC, which counts every process of the user on the host, not this one's; the sandbox's PID namespace
    and the run's deadline bound them."""
    try:
        import resource
    except ImportError:
        return
    for name, want in (("RLIMIT_FSIZE", FILE_LIMIT), ("RLIMIT_NOFILE", OPEN_FILES), ("RLIMIT_CORE", 0)):
        which = getattr(resource, name, None)
        if which is None:
            continue
        soft, hard = resource.getrlimit(which)
        cap = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(which, (cap, cap))
        except (ValueError, OSError):
            pass


def _load_object(target: dict):
    """Execute a file or module target; return the module, or its attribute."""
    if target.get("path"):
        path = Path(target["path"])
        # its own name, as `import stem` would give it (a name taken already, by torch or the standard library,
        # gets a suffix): nothing in the module's name says how it is being run
        name = re.sub(r"\W", "_", path.stem) or "module"
        while name in sys.modules:
            name += "_"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path.name} as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and relative lookups need it there
        sys.path.insert(0, str(path.parent))  # its sibling modules import as they would under `python file.py`
        spec.loader.exec_module(module)
        return module
    sys.path.insert(0, os.getcwd())
    obj = importlib.import_module(target["module"])
    for part in (target.get("attribute") or "").split("."):
        if part:
            if not hasattr(obj, part):
                raise AttributeError(f"module {target['module']!r} has no attribute {target['attribute']!r}")
            obj = getattr(obj, part)
    return obj


def load(chan: Channel, init: dict):
    """Load the candidate `init` names; say what was found. Its functions by name, or None."""
    import torch

    env = init.get("env")
    if isinstance(env, dict):  # the allow-listed environment of the check that asked (a spare started earlier)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    try:
        os.chdir(init.get("cwd") or os.getcwd())
    except OSError:
        pass
    if init.get("threads"):
        torch.set_num_threads(int(init["threads"]))
    _hard_limits()
    note = _limit_memory(init.get("memory_mb")) if str(init.get("device", "cpu")).startswith("cpu") else None
    try:
        from collections.abc import Mapping

        obj = _load_object(init["target"])
        found, missing, not_callable = {}, [], []
        for n in init["names"]:
            fn = obj.get(n) if isinstance(obj, Mapping) else getattr(obj, n, None)
            if fn is None:
                missing.append(n)
            elif not callable(fn):
                not_callable.append(n)
            else:
                found[n] = fn
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt in module code too
        if isinstance(exc, SyntaxError):  # its str() holds the file's absolute path: name the file only
            text = f"{exc.msg} ({Path(exc.filename or '?').name}:{exc.lineno})"
        else:
            where = _where(exc, _root(init))
            text = f"{exc}" + (f" ({where})" if where else "")
        chan.send({"op": "load_error", "fatal": not isinstance(exc, Exception),
                   "message": f"{type(exc).__name__}: {text}"})
        return None
    chan.send({"op": "loaded", "missing": missing, "not_callable": not_callable, "note": note})
    return None if missing or not_callable else found


def _root(init: dict) -> str:
    path = (init.get("target") or {}).get("path")
    return os.path.abspath(os.path.dirname(path) if path else (init.get("cwd") or os.getcwd()))


def _reached(outs: list, leaves: list) -> list:
    """Indices of the `leaves` the graph of `outs` reaches: the inputs of this result's vector-Jacobian product
    (a generator's later item need not depend on an earlier item's call backs, whose graph may be gone there)."""
    want = {id(t): i for i, t in enumerate(leaves)}
    found = {want[id(t)] for t in outs if id(t) in want}
    seen: set = set()
    stack = [t.grad_fn for t in outs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if var is not None and id(var) in want:
            found.add(want[id(var)])
        stack.extend(nxt for nxt, _ in node.next_functions)
    return sorted(found)


def serve(chan: Channel, init: dict) -> int:
    import torch

    found = load(chan, init)
    if found is None:
        return 0
    root = _root(init)
    own = {}
    for name, fn in found.items():
        code = getattr(inspect.unwrap(fn), "__code__", None)
        own[name] = code.co_filename if code is not None else None
    graphs: dict = {}  # call id -> (input tensors, differentiable output tensors)
    iters: dict = {}  # call id -> (function name, the generator, its inputs that carry gradient)
    active: list = [[]]  # the inputs of the request being served: a callback's graded outputs join them
    meters: dict = {}  # call id -> its allocation meter (a budget contract's call, and later its vjp)

    def exchange(head: dict, args: tuple, kwargs: dict) -> tuple[dict, bytes]:
        """Send a call back to the supervisor and take its answer; what it raised, raised here."""
        chan.send(head, pack((tuple(args), dict(kwargs))))
        head, data = chan.recv()
        if head is None:
            raise RuntimeError("the caller's side closed the boundary mid-call")
        if head.get("op") == "raised":
            cls = getattr(builtins, str(head.get("type")), None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = RuntimeError
            raise cls(str(head.get("message")))
        if head.get("op") != "answer":
            raise RuntimeError("the caller's side did not answer the call back")
        return head, data

    def callback(index: int, args: tuple, kwargs: dict):
        """Call the supervisor's object `index` (a handle's __call__): its answer's graded outputs become inputs
        of the current call here, so the vector-Jacobian call returns their gradients too."""
        head, data = exchange({"op": "callback", "h": index, "grad_mode": torch.is_grad_enabled()}, args, kwargs)
        out, tensors = unpack(data, handle)  # a handle in an answer: a policy's state, to pass back as `state`
        for i in head.get("grad") or []:
            tensors[i].requires_grad_(True)
            active[0].append(tensors[i])
        return out

    def ask(index: int, what: str, args: tuple):
        """A handle's request of the supervisor's object other than a call (a deep copy, a copy's mode): the
        answer is a handle to the copy, or None."""
        return unpack(exchange({"op": "callback", "h": index, "do": what}, args, {})[1], handle)[0]

    def handle(index: int, kind: str, attrs: dict):
        return Handle(callback, index, kind, attrs, ask)

    def reply(cid, out, fn_name, leaves, extra=None):
        if hasattr(out, "__next__") and not isinstance(out, torch.Tensor):  # a generator: items on demand
            iters[cid] = (fn_name, out, leaves)
            chan.send({"op": "iter", "id": cid})
            return
        try:
            plain = _plain(out)
        except Refused as why:
            chan.send({"op": "refused", "id": cid, "message": f"{fn_name}: {why}"})
            return
        outs = _tensors(out, [])
        diff = [j for j, t in enumerate(outs) if t.requires_grad] if leaves else []
        used = _reached([outs[j] for j in diff], leaves) if diff else []
        if diff:
            graphs[cid] = ([leaves[i] for i in used], [outs[j] for j in diff])
            while len(graphs) > MAX_GRAPHS:
                graphs.pop(next(iter(graphs)))
        chan.send(dict({"op": "ok", "id": cid, "diff": diff, "inputs": used}, **(extra or {})), pack(plain))

    while True:
        head, data = chan.recv()
        if head is None or head.get("op") == "stop":
            return 0
        op, cid = head.get("op"), head.get("id")
        if op == "reset":
            graphs.clear()
            iters.clear()
            meters.clear()
            continue
        fn_name = head.get("fn") if op == "call" else (iters.get(cid) or ("?",))[0]
        try:
            if op == "call":
                fn = found[fn_name]
                (args, kwargs), leaves = unpack(data, handle)
                grad = [leaves[i] for i in head.get("grad") or []]
                for t in grad:
                    t.requires_grad_(True)
                active[0] = grad
                with torch.set_grad_enabled(bool(head.get("grad_mode", True))):
                    if head.get("meter"):
                        meters[cid] = meter = _meter_class()()
                        while len(meters) > MAX_GRAPHS:
                            meters.pop(next(iter(meters)))
                        out = _metered(meter, lambda: fn(*args, **kwargs))
                    else:
                        out = fn(*args, **kwargs)
                reply(cid, out, fn_name, grad, {"metered": meters[cid].report()} if head.get("meter") else None)
            elif op == "next":
                _name, gen, leaves = iters[cid]
                active[0] = leaves
                with torch.set_grad_enabled(bool(head.get("grad_mode", True))):
                    item = next(gen)
                reply(f"{cid}.{head.get('k')}", item, fn_name, leaves)
            elif op == "vjp":
                ins, outs = graphs[cid]
                gs, _ = unpack(data)
                pairs = [(o, g) for o, g in zip(outs, gs) if g is not None]
                meter = meters.get(cid) if head.get("meter") else None

                def backward():
                    if not pairs:
                        return [None] * len(ins)
                    return torch.autograd.grad([o for o, _ in pairs], ins, [g for _, g in pairs],
                                               allow_unused=True, retain_graph=True)

                if head.get("rows") is not None:  # every basis vector of one output, in one request
                    grads = _rows(ins, outs, head.get("rows"))
                else:
                    grads = _metered(meter, backward) if meter is not None else backward()
                chan.send(dict({"op": "ok", "id": cid, "diff": []}, **({"metered": meter.report()} if meter else {})),
                          pack([_plain(g) for g in grads]))
            else:
                chan.send({"op": "raised", "type": "RuntimeError", "message": f"unknown request {op!r}",
                           "where": "", "stub": False})
        except BaseException as exc:  # noqa: BLE001 - whatever the candidate raised crosses as its builtin type
            if op == "vjp" and isinstance(exc, KeyError):
                chan.send({"op": "raised", "type": "RuntimeError", "where": "", "stub": False,
                           "message": "the candidate's graph for this call is gone (backward long after forward)"})
                continue
            chan.send(_raised(exc, root, own.get(fn_name)))
            if op == "next" and isinstance(exc, StopIteration):
                iters.pop(cid, None)


def _rows(ins: list, outs: list, j) -> list:
    """Per input, the vector-Jacobian products of output `j` for each of its basis vectors, stacked [numel, *input
    shape] (None where the input is not reached): the Jacobian row by row, the same product each row alone gives."""
    import torch

    if type(j) is not int or not 0 <= j < len(outs):
        raise ValueError("no such output of this call")
    out = outs[j]
    rows: list = [[] for _ in ins]
    for k in range(out.numel()):
        basis = torch.zeros_like(out).reshape(-1)
        basis[k] = 1
        got = torch.autograd.grad([out], ins, [basis.reshape(out.shape)], allow_unused=True, retain_graph=True)
        for i, g in enumerate(got):
            rows[i].append(g)
    return [None if any(g is None for g in r) or not r else torch.stack(r) for r in rows]


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides what an interrupt means
    chan = Channel(int(argv[0]), int(argv[1]))
    import torch  # noqa: F401 - before the candidate arrives: a spare process has its imports done

    chan.send({"op": "ready"})
    head, _ = chan.recv()
    if head is None or head.get("op") != "init":
        return 0
    return serve(chan, head)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
