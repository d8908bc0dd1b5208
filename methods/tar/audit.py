"""Audit of the TAR mechanism run's harness steps, on the run's own tensors.

The mechanism run calls the implementation's encoder, bank scoring and KL term; this audit
recomputes each independently and records how far the run's values are from it:

* encoder: the base's hidden states averaged over each candidate's valid response tokens by
  a float64 loop, and the bank's prototypes re-picked from those embeddings by the brute-force
  FPS loop of `reference.py` (pooling over padding moves both);
* bank scoring: the bank tokens re-scored by the frozen base (scored by the live policy, the
  run's reference log-probs drift from it as soon as the policy moves);
* KL: KL(pi_theta || pi_base) and the reverse direction in float64 from the run's own
  full-vocabulary distributions (the gap between the two shows the check can tell them apart);
* replay: on how many updates it fired (a gate above the float32 noise of an unchanged policy,
  with a non-zero replay gradient).
"""

from __future__ import annotations

# Check code, not a mutation target of `contracts mutate`: it only re-measures the mechanism run's
# tensors against independent float64 loops; the run itself (mechanism.py, harness.py) is mutated.
__mutate__ = False

import math

import torch

from methods.common.rollout import sequence_logprobs
from methods.tar import reference as ref

# An unchanged policy and the frozen base run different CPU GRU kernels (training vs eval mode)
# whose log-probs can differ in the last float32 bit: gates of about 5e-8 come from that, not
# from suppression. A fired replay has a gate above this.
GATE_NOISE = 1e-4


def _bad(x: float) -> float:
    return math.inf if math.isnan(x) else x


class HarnessAudit:
    def __init__(self) -> None:
        self.encoder_err = 0.0
        self.fps_mismatch = 0
        self.padded_candidates = 0
        self.bank_base_err = 0.0
        self.kl_err = 0.0
        self.kl_gap = 0.0
        self.kl_min = math.inf
        self.fired_steps = 0
        self.max_gate = 0.0
        self.max_fired_grad = 0.0

    @torch.no_grad()
    def bank(self, base, prompts, roll, correct, emb, keep, cfg) -> None:
        P = prompts.shape[1]
        _, hidden, _ = base(torch.cat([prompts, roll.responses], dim=1))
        hidden = hidden[:, P:].double().cpu().tolist()
        mask = roll.mask.bool().cpu().tolist()
        want = []
        for h_rows, m_row in zip(hidden, mask):
            valid = [h for h, v in zip(h_rows, m_row) if v]
            want.append([math.fsum(col) / len(valid) for col in zip(*valid)] if valid else [0.0] * len(h_rows[0]))
            self.padded_candidates += int(not all(m_row))
        got = emb.detach().to("cpu", torch.float64).tolist()
        if len(got) != len(want) or any(len(a) != len(b) for a, b in zip(got, want)):
            self.encoder_err = math.inf
        else:
            self.encoder_err = max(_bad(abs(x - y)) for a, b in zip(got, want) for x, y in zip(a, b))
        ids = [i // cfg["base_samples"] for i in range(len(want))]
        picks = ref.fps_bruteforce(want, correct.cpu().tolist(), cfg["bank_k"], ids)
        self.fps_mismatch = int(picks != [int(i) for i in keep.cpu().tolist()])

    @torch.no_grad()
    def step(self, base, roll, bank_sel, parts, rep_norm: float) -> None:
        lb = parts["bank_base_logp"]
        if lb is not None:
            want, _ = sequence_logprobs(base, bank_sel.prompts, bank_sel.responses)
            m = bank_sel.mask.bool()
            diff = torch.where(m, (lb.detach().double() - want.double()).abs(), torch.zeros((), dtype=torch.float64,
                                                                                           device=m.device))
            self.bank_base_err = max(self.bank_base_err, _bad(float(diff.max())))
        lt, lq = parts["logdist"].double(), parts["base_logdist"].double()
        m = roll.mask.bool()
        fwd_tok = (lt.exp() * (lt - lq)).sum(-1)
        rev_tok = (lq.exp() * (lq - lt)).sum(-1)
        n = int(m.sum())
        fwd = float(torch.where(m, fwd_tok, torch.zeros_like(fwd_tok)).sum()) / n
        rev = float(torch.where(m, rev_tok, torch.zeros_like(rev_tok)).sum()) / n
        self.kl_err = max(self.kl_err, _bad(abs(float(parts["kl"].detach()) - fwd)))
        self.kl_gap = max(self.kl_gap, abs(fwd - rev))
        self.kl_min = min(self.kl_min, _bad(float(parts["kl"].detach())))
        gates = parts["replay_metrics"]["gates"].detach().double()
        gmax = float(gates.max()) if gates.numel() else 0.0
        self.max_gate = max(self.max_gate, gmax)
        if gmax > GATE_NOISE and rep_norm > 0:
            self.fired_steps += 1
            self.max_fired_grad = max(self.max_fired_grad, rep_norm)

    def measurements(self) -> dict:
        return {
            "encoder_max_abs_err": self.encoder_err,
            "bank_fps_mismatch": self.fps_mismatch,
            "padded_candidates": self.padded_candidates,
            "bank_base_logp_max_abs_err": self.bank_base_err,
            "kl_max_abs_err": self.kl_err,
            "kl_direction_gap": self.kl_gap,
            "kl_min": self.kl_min,
            "replay_fired_steps": self.fired_steps,
            "replay_max_gate": self.max_gate,
            "replay_fired_max_grad_norm": self.max_fired_grad,
        }
