"""Fast paths added for the benchmarks equal the paths they replace."""

from __future__ import annotations

import math

import pytest
import torch

from methods.mrtpo.credit import credit_weights, credit_weights_from_logits


def logits_case(B=3, T=7, V=500, K=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    loo = [base + 0.3 * torch.randn(B, T, V, generator=g, dtype=torch.float64) for _ in range(K)]
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0, 0] = True
    mask[1] = False  # a response with no valid token
    return base.to(dtype), [x.to(dtype) for x in loo], mask


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-12), (torch.bfloat16, 2e-6)])
@pytest.mark.parametrize("block_elems", [1000, 3 * 500, 1 << 20])  # 2 rows, 3 rows, everything at once
def test_chunked_logits_path_equals_log_softmax_then_credit_weights(dtype, tol, block_elems):
    la, loo, mask = logits_case(dtype=dtype)
    loo[1] = None  # an empty block
    empty = torch.tensor([[False, False, True], [False] * 3, [False] * 3])  # [K, B]
    cdt = torch.float64 if dtype == torch.float64 else torch.float32
    ref = credit_weights(torch.log_softmax(la.to(cdt), -1), [None if x is None else torch.log_softmax(x.to(cdt), -1)
                                                             for x in loo], mask, 0.6, empty_block=empty)
    got = credit_weights_from_logits(la, loo, mask, 0.6, empty_block=empty, block_elems=block_elems, chunk_elems=700)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    # credit is conserved per response: weights sum to its valid length
    torch.testing.assert_close(got.sum(-1).double(), mask.sum(-1).double().expand(3, -1), rtol=1e-5, atol=1e-5)


def test_masked_rows_are_never_read():
    la, loo, mask = logits_case()
    junk = [x.clone() for x in [la] + loo]
    for x in junk:
        x[~mask] = math.nan
    clean = credit_weights_from_logits(la, loo, mask, 0.5, block_elems=1000)
    dirty = credit_weights_from_logits(junk[0], junk[1:], mask, 0.5, block_elems=1000)
    assert torch.equal(clean, dirty)


def test_logits_path_refuses_bad_shapes():
    la, loo, mask = logits_case()
    with pytest.raises(ValueError, match="logits_loo\\[1\\]"):
        credit_weights_from_logits(la, [loo[0], loo[1][:, :3]], mask, 0.5)
    with pytest.raises(ValueError, match="mask"):
        credit_weights_from_logits(la, loo, mask[:, :3], 0.5)
