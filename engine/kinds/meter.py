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
from torch.utils._pytree import tree_leaves

class AllocationMeter(TorchDispatchMode):
    """`with AllocationMeter() as meter: ...` then read `meter.peak_bytes` (and `meter.ops`)."""

    def __init__(self):
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self.allocations = 0
        self.ops = 0  # ATen operations dispatched (a Python loop over rows shows as many more)
        self._live: dict[int, list[int]] = {}  # storage pointer -> [nbytes, tracked tensors alive]
        self._external: set[int] = set()

    def _release(self, ptr: int) -> None:
        entry = self._live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current_bytes -= entry[0]
            del self._live[ptr]

    @staticmethod
    def _ptr(t: torch.Tensor) -> tuple[int, int]:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                ptr, _ = self._ptr(t)
                if ptr and ptr not in self._live:
                    self._external.add(ptr)  # existed before the block: not ours to count
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            ptr, nbytes = self._ptr(t)
            if ptr == 0 or nbytes == 0 or ptr in self._external:
                continue
            entry = self._live.get(ptr)
            if entry is None:
                entry = self._live[ptr] = [nbytes, 0]
                self.current_bytes += nbytes
                self.allocations += 1
                self.peak_bytes = max(self.peak_bytes, self.current_bytes)
            entry[1] += 1
            weakref.finalize(t, self._release, ptr)
        return out

