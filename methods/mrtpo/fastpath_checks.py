"""MRTPO fast paths against their plain paths, on the same inputs, with inputs that select each branch.

- js_distance cuts a row into column blocks when few rows meet a large
  vocabulary (N x V above the block size, one row larger than a block); the
  same rows inside a larger input are done as whole rows.
- credit_weights_from_logits (the memory-saving path) normalises a block of
  valid rows at a time; credit_weights takes whole log-softmaxes.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.mrtpo.cases import response_mask, to_lists
from methods.mrtpo.credit import js_block_shape
from methods.mrtpo.reference import js_distance_ref
from methods.mrtpo.measure import NAN, maxabs as _maxabs, worst as _worst

# Check code: drives the fast and plain paths and compares them; implements nothing the method uses.
__mutate__ = False  # `contracts mutate` does not plant bugs here


def _randint(g, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, (), generator=g))


@registry.check("mrtpo.js_column_blocks")
def js_column_blocks(impl, ctx):
    """js_distance's column-blocked path (few rows, large vocabulary; or a block smaller than a row) equals
    whole rows on the same inputs, and the decimal reference on small vocabularies; an input that is not one
    block of rows (split into row views) equals its contiguous copy."""
    g = ctx.generator(701)
    V = int(ctx.params.get("large_vocab", 150_000))
    rows, copies = 2, int(ctx.params.get("copies", 16))
    a = torch.randn(rows, V, generator=g).mul(2.0).log_softmax(-1).to(ctx.device, ctx.dtype)
    b = torch.randn(rows, V, generator=g).mul(2.0).log_softmax(-1).to(ctx.device, ctx.dtype)
    q_cols = impl.js_distance(a, b).double()
    q_rows = impl.js_distance(a.repeat(copies, 1), b.repeat(copies, 1)).double().view(copies, rows)
    col_path = js_block_shape(rows, V)[1] < V
    row_path = js_block_shape(rows * copies, V)[1] == V
    large = _maxabs((q_rows - q_cols[None]) / q_rows.clamp_min(1e-30))
    small_diff = small_err = 0.0
    col_cases = 0
    for _ in range(ctx.cases):
        Vs = _randint(g, 20, 60)
        chunk = _randint(g, 3, Vs - 1)
        if Vs % chunk == 0:  # keep a partial last column block
            chunk -= 1
        la = torch.randn(3, Vs, generator=g, dtype=torch.float64).mul(3.0).log_softmax(-1).to(ctx.device, ctx.dtype)
        lb = torch.randn(3, Vs, generator=g, dtype=torch.float64).mul(3.0).log_softmax(-1).to(ctx.device, ctx.dtype)
        col_cases += int(js_block_shape(3, Vs, chunk)[1] < Vs)
        qc = impl.js_distance(la, lb, chunk_elems=chunk).double().cpu()
        qr = impl.js_distance(la, lb).double().cpu()
        small_diff = _worst(small_diff, _maxabs(qc - qr))
        ref = torch.tensor([js_distance_ref(x, y) for x, y in zip(*to_lists(la, lb))], dtype=torch.float64)
        small_err = _worst(small_err, _maxabs(qc - ref))
    # inputs that are not one block of rows (a slice of a longer tensor) are split into row views: the same
    # rows, whole and cut into columns, as their contiguous copies
    big_a = torch.randn(4, 7, 33, generator=g, dtype=torch.float64).mul(2.0).log_softmax(-1).to(ctx.device, ctx.dtype)
    big_b = torch.randn(4, 7, 33, generator=g, dtype=torch.float64).mul(2.0).log_softmax(-1).to(ctx.device, ctx.dtype)
    sa, sb = big_a[:, :5], big_b[:, :5]
    strided = 0.0
    for chunk in (1 << 20, 16):
        got = impl.js_distance(sa, sb, chunk_elems=chunk)
        want = impl.js_distance(sa.contiguous(), sb.contiguous(), chunk_elems=chunk)
        strided = _worst(strided, _maxabs(got.double() - want.double()) if got.shape == want.shape else NAN)
    return {
        "strided_max_abs_diff": strided,
        "large_vocab_column_path": col_path,
        "large_vocab_row_path": row_path,
        "large_vocab_max_rel_diff": large,
        "small_vocab_column_cases": col_cases,
        "small_vocab_max_abs_diff": small_diff,
        "small_vocab_ref_max_abs_err": small_err,
    }


@registry.check("mrtpo.weights_from_logits")
def weights_from_logits(impl, ctx):
    """credit_weights_from_logits equals credit_weights on the log-softmaxes of the same logits: several row
    blocks with a partial last one, column-blocked JS inside, None (empty) rewards, empty responses and NaN
    junk in masked logits rows."""
    g = ctx.generator(702)
    err = 0.0
    multi = tail = none_cases = 0
    for i in range(ctx.cases):
        K, B, T, V = _randint(g, 1, 3), _randint(g, 2, 5), _randint(g, 2, 7), _randint(g, 8, 40)
        scale = 0.5 + 3.0 * float(torch.rand((), generator=g))
        la = torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale
        ll = [la + torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale * 0.5 for _ in range(K)]
        mask = response_mask(g, B, T)
        keep = mask[:, :, None].expand(B, T, V)
        la = torch.where(keep, la, math.nan)  # masked rows are never read: junk there changes nothing
        ll = [torch.where(keep, x, math.nan) for x in ll]
        loo = [None if (K > 1 and k == i % K and i % 3 == 0) else x for k, x in enumerate(ll)]
        none_cases += int(any(x is None for x in loo))
        empty = (torch.rand(K, B, generator=g) < 0.2).to(ctx.device)
        beta = float(torch.rand((), generator=g, dtype=torch.float64))
        n_valid = int(mask.sum())
        rows_per_block = _randint(g, 1, max(1, n_valid - 1))
        block_elems = rows_per_block * V
        if i % 4 == 3:  # a block smaller than one row: one row at a time
            rows_per_block, block_elems = 1, V - 1
        multi += int(n_valid > rows_per_block)
        tail += int(n_valid > rows_per_block and n_valid % rows_per_block != 0)
        chunk = (V - 3) if i % 2 else 1 << 20  # column-blocked JS inside, every other case
        on = [None if x is None else x.to(ctx.device, ctx.dtype) for x in loo]
        a = la.to(ctx.device, ctx.dtype)
        m = mask.to(ctx.device)
        fast = impl.credit_weights_from_logits(a, on, m, beta, empty_block=empty, chunk_elems=chunk,
                                               block_elems=block_elems)
        plain = impl.credit_weights(torch.log_softmax(a, -1), [None if x is None else torch.log_softmax(x, -1) for x in on],
                                    m, beta, empty_block=empty, chunk_elems=chunk)
        err = _worst(err, _maxabs(fast.double() - plain.double()))
    return {"max_abs_diff": err, "multi_block_cases": multi, "partial_tail_cases": tail, "none_cases": none_cases}
