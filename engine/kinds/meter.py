"""Peak bytes of tensor storage created inside a block of code, on any device, and the ATen operations dispatched.

CPU torch has no allocator statistics, so this counts at the ATen level: a
TorchDispatchMode sees every op, notes each output whose storage it has not
seen before (and that is not a pre-existing input), and subtracts the bytes
when the last tensor it saw on that storage is garbage-collected. Views and
in-place results share their storage and are not counted twice. On CUDA the
caller can cross-check with torch.cuda.max_memory_allocated.

The budget kind measures with these; no method's code runs them.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _tensors(x, out: list) -> list:
    """The tensors in an ATen argument or result (a tensor, or lists/tuples of them), appended to `out`.

    Not torch's pytree walk: this runs for every operation of a metered call, and a generic walk costs more than
    most of the operations (a loop over rows, the budget's own target, dispatches tens of thousands)."""
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    return out


class OpLimitReached(BaseException):
    """Raised inside a metered call at its operation past the meter's `max_ops`: the call is abandoned there.

    A BaseException, so that the code under measure does not swallow it with `except Exception`."""


class AllocationMeter(TorchDispatchMode):
    """`with AllocationMeter() as meter: ...` then read `meter.peak_bytes` (and `meter.ops`). With `max_ops`, the
    operation past it raises OpLimitReached and `meter.stopped` is set: a Python loop over rows would otherwise
    run to its end under the meter (thousands of operations, each through Python) only to fail the budget."""

    def __init__(self, max_ops: int | None = None):
        super().__init__()
        self.max_ops = max_ops
        self.stopped = False
        self.current_bytes = 0
        self.peak_bytes = 0
        self.allocations = 0
        self.ops = 0  # ATen operations dispatched (a Python loop over rows shows as many more)
        self._live: dict[int, list[int]] = {}  # storage pointer -> [nbytes, tracked tensors alive]
        self._external: set[int] = set()
        self._refs: dict[int, weakref.ref] = {}  # weak references to the tracked tensors, by id (a tensor's
        # reference compares as the tensor does), each alive until its tensor dies

    def _release(self, ptr: int) -> None:
        entry = self._live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current_bytes -= entry[0]
            del self._live[ptr]

    def _track(self, t: torch.Tensor, ptr: int) -> None:
        # a plain weak reference with a callback (kept in _refs), not weakref.finalize: as cheap, per output
        refs, release = self._refs, self._release

        def dead(ref, ptr=ptr):
            refs.pop(id(ref), None)
            release(ptr)

        ref = weakref.ref(t, dead)
        refs[id(ref)] = ref

    @staticmethod
    def _ptr(t: torch.Tensor) -> tuple[int, int]:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        if self.max_ops is not None and self.ops > self.max_ops:
            self.stopped = True
            raise OpLimitReached(f"more than {self.max_ops} ATen operations")
        found: list = []
        _tensors(args, found)
        for v in kwargs.values():
            _tensors(v, found)
        live, external = self._live, self._external
        for t in found:
            ptr = t.untyped_storage().data_ptr()
            if ptr and ptr not in live:
                external.add(ptr)  # existed before the block: not ours to count
        out = func(*args, **kwargs)
        for t in _tensors(out, []):
            ptr, nbytes = self._ptr(t)
            if ptr == 0 or nbytes == 0 or ptr in external:
                continue
            entry = live.get(ptr)
            if entry is None:
                entry = live[ptr] = [nbytes, 0]
                self.current_bytes += nbytes
                self.allocations += 1
                if self.current_bytes > self.peak_bytes:
                    self.peak_bytes = self.current_bytes
            entry[1] += 1
            self._track(t, ptr)
        return out
