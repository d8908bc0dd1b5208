"""Audit of the TAR mechanism run, on the run's own tensors: everything the mechanism contract judges.

methods/tar/mechanism.py only runs the method (bank, updates); this records and measures:

* the bank: every entry re-verified and found among the base's own samples, min(k, #correct)
  entries per prompt; the encoder against a float64 loop over each candidate's valid response
  tokens and the picks against the brute-force FPS loop of `reference.py` on those embeddings
  (pooling over padding moves both);
* per update: the actor's inputs under flipped rewards and the gradient under shifted rewards
  (the actor never reads the verifier); the gradient of each term and the total's gradient
  against grad GRPO + beta grad KL + lambda grad replay with the spec's coefficients; the bank
  tokens re-scored by the live policy and by the frozen base (scored by the live policy, the
  reference log-probs drift from the base as soon as the policy moves); the replay loss against
  the float64 loop reference on the run's own log-probs; KL(pi_theta || pi_base) and the reverse
  direction in float64 from the run's full-vocabulary distributions (the gap between the two
  shows the check can tell them apart); whether replay fired (a gate above the float32 noise of
  an unchanged policy, with a non-zero replay gradient);
* the receipt's step records (the page's records: candidates, verifier bits, FPS indices,
  per-update gates and token weights).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from engine.run import run_audit
from methods.common import audited
from methods.common.policy import param_l2_change, state_copy
from methods.common.rollout import sequence_logprobs
from methods.tar import reference as ref

# Check code, not a mutation target of `contracts mutate`: it only measures the run (mechanism.py
# and harness.py, which are mutated) against independent float64 loops and counterfactuals.
__mutate__ = False

# An unchanged policy and the frozen base run different CPU GRU kernels (training vs eval mode)
# whose log-probs can differ in the last float32 bit: gates of about 5e-8 come from that, not
# from suppression. A fired replay has a gate above this.
GATE_NOISE = 1e-4
# |mean delta| of a bank row below which float32 may put its gate on either side of 0 (a report of the share of
# active rows may count such a row either way).
DELTA_ROUNDING = 1e-6
# What adaptive_replay_loss's metrics dict declares (the interface), each compared with the float64 loop's.
REPORTED = ("gates", "mean_delta", "token_weights", "weight_sum", "active_fraction", "num_trajectories")


def _bad(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _grads(loss, params):
    if not loss.requires_grad:
        return [torch.zeros_like(p) for p in params]
    gs = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, gs)]


def _norm(gs) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs))


class _InputRecorder:
    """Forward pre-hook on the actor: keeps a copy of every input it is given."""

    def __init__(self, module):
        self.inputs: list[torch.Tensor] = []
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.inputs.append(args[0].detach().clone())

    def close(self):
        self.handle.remove()


def _same_inputs(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


class RunAudit:
    def __init__(self, ctx, task, policy, base) -> None:
        self.ctx, self.task, self.policy, self.base = ctx, task, policy, base
        p = ctx.params
        self.base_samples, self.bank_k = int(p["base_samples"]), int(p["bank_k"])
        self.beta_kl, self.lambda_rep = float(p["beta_kl"]), float(p["lambda_rep"])
        self.base_before, self.policy_before = state_copy(base), state_copy(policy)
        self.base_trainable = sum(int(q.requires_grad) for q in base.parameters())
        self.params = [q for q in policy.parameters() if q.requires_grad]  # a LoRA checkpoint freezes its base weights
        self.m: dict = {}
        self.encoder_err = 0.0
        self.fps_mismatch = 0
        self.padded_candidates = 0
        self.bank_base_err = self.bank_policy_err = self.replay_err = 0.0
        self.kl_err = self.kl_gap = 0.0
        self.kl_min = math.inf
        self.fired_steps = 0
        self.max_gate = self.max_fired_grad = 0.0
        self.inputs_invariant, self.shift_diff, self.composition_err = True, 0.0, 0.0
        self.active_steps = self.active_zero_grad = self.inactive_nonzero_replay = 0
        self.first_step_replay_abs = self.first_step_gate_max = math.nan
        self.min_total_grad = math.inf
        self.nonzero_grad_steps = 0
        self.grpo_grad_max = self.kl_grad_max = 0.0
        self._recorder = None
        self._seen: list[torch.Tensor] = []
        self._bank = None
        self.selection_mismatch = self.replayed_rows = self.other_prompt_rows = 0
        self.replay_grad_err = 0.0
        self._replay = None  # the update's replay by the float64 loops (supervisor's figures)

    # --- the bank --------------------------------------------------------------------------

    @torch.no_grad()
    def bank(self, bank, src) -> None:
        ctx, task, n = self.ctx, self.task, self.base_samples
        roll, correct = src.roll, src.correct
        ctx.record_step(step=0, phase="bank", candidates=int(src.prompts.shape[0]),
                        candidate_prompt=src.prompt_ids.tolist(), verifier_correct=correct.int().tolist(),
                        fps_indices=src.keep.tolist(), bank_prompt=src.prompt_ids[src.keep].tolist())
        self._bank = bank
        rows = int(bank.responses.shape[0])
        n_prompts = int(src.prompts.shape[0]) // n
        not_sampled = 0
        for r in range(rows):
            same = src.prompt_ids == bank.prompt_index[r]
            hit = (roll.responses[same] == bank.responses[r]).all(1) & (roll.mask[same] == bank.mask[r]).all(1)
            not_sampled += int(not bool(hit.any()))
        per_prompt = (torch.bincount(bank.prompt_index.cpu(), minlength=n_prompts) if rows
                      else torch.zeros(n_prompts, dtype=torch.long))
        correct_per_prompt = correct.view(n_prompts, n).sum(1).cpu()
        self.m.update({
            "bank_size": rows,
            "bank_candidates": int(src.prompts.shape[0]),
            "bank_correct_candidates": int(correct.sum()),
            "bank_incorrect": int((task.verify(bank.prompts, bank.responses, bank.mask) < 0.5).sum()) if rows else 0,
            "bank_not_base_samples": not_sampled,
            "bank_max_per_prompt": int(per_prompt.max()) if per_prompt.numel() else 0,
            "bank_count_mismatch": int((per_prompt != correct_per_prompt.clamp_max(self.bank_k)).sum()),
        })
        self._encoder(src)

    def _encoder(self, src) -> None:
        P = src.prompts.shape[1]
        _, hidden, _ = self.base(torch.cat([src.prompts, src.roll.responses], dim=1))
        hidden = hidden[:, P:].double().cpu().tolist()
        mask = src.roll.mask.bool().cpu().tolist()
        want = []
        for h_rows, m_row in zip(hidden, mask):
            valid = [h for h, v in zip(h_rows, m_row) if v]
            want.append([math.fsum(col) / len(valid) for col in zip(*valid)] if valid else [0.0] * len(h_rows[0]))
            self.padded_candidates += int(not all(m_row))
        got = src.embeddings.detach().to("cpu", torch.float64).tolist()
        if len(got) != len(want) or any(len(a) != len(b) for a, b in zip(got, want)):
            self.encoder_err = math.inf
        else:
            self.encoder_err = max(_bad(abs(x - y)) for a, b in zip(got, want) for x, y in zip(a, b))
        ids = [i // self.base_samples for i in range(len(want))]
        picks = ref.fps_bruteforce(want, src.correct.cpu().tolist(), self.bank_k, ids)
        self.fps_mismatch = int(picks != [int(i) for i in src.keep.cpu().tolist()])

    # --- each update -----------------------------------------------------------------------

    @contextmanager
    def actor_inputs(self):
        """Record every input the actor is given inside the block (the update's own loss)."""
        rec = _InputRecorder(self.policy)
        try:
            yield
        finally:
            rec.close()
            self._seen = rec.inputs

    def update(self, step, idx, roll, rewards, bank_sel, total, parts, losses) -> None:
        """Everything judged about one update, before its optimizer step; `losses(r)` re-runs the
        update's loss with rewards r (the counterfactuals)."""
        # The actor's inputs must not depend on the verifier's result, and a reward shift (same
        # advantages) must not move the gradient.
        rec = _InputRecorder(self.policy)
        try:
            losses(1.0 - rewards)
        finally:
            rec.close()
        self.inputs_invariant &= _same_inputs(self._seen, rec.inputs)
        total_shift, _ = losses(rewards + 0.5)
        params = self.params
        g_total = _grads(total, params)
        g_shift = _grads(total_shift, params)
        self.shift_diff = max(self.shift_diff, max(float((a - b).abs().max()) for a, b in zip(g_total, g_shift)))

        rep, met = parts["replay"], parts["replay_metrics"]
        g_rep, g_grpo, g_kl = _grads(rep, params), _grads(parts["grpo"], params), _grads(parts["kl"], params)
        rep_norm, total_norm = _norm(g_rep), _norm(g_total)
        self.grpo_grad_max = max(self.grpo_grad_max, _norm(g_grpo))
        self.kl_grad_max = max(self.kl_grad_max, _norm(g_kl))
        scale = max(max(float(g.abs().max()) for g in g_total), 1e-30)
        for gt, gg, gk, gr in zip(g_total, g_grpo, g_kl, g_rep):
            want = gg.double() + self.beta_kl * gk.double() + self.lambda_rep * gr.double()
            self.composition_err = max(self.composition_err, _bad(float((gt.double() - want).abs().max()) / scale))
        self.min_total_grad = min(self.min_total_grad, total_norm)
        self.nonzero_grad_steps += int(total_norm > 0)

        self._replay = self._replay_figures(bank_sel, parts)
        self._harness(roll, bank_sel, parts, rep_norm)
        self._selection(idx, bank_sel, parts)
        fig = self._replay
        gates = fig["gates"]
        gmax = float(gates.max()) if gates.numel() else 0.0
        self.active_steps += int(gmax > 0)
        # fired: a gate above the float32 noise of an unchanged policy (a tinier one may be 0 in float32)
        self.active_zero_grad += int(gmax > GATE_NOISE and rep_norm == 0.0)
        # silent: no bank row's mean delta is positive, so the paper's replay loss is exactly 0
        self.inactive_nonzero_replay += int(gmax == 0.0 and abs(float(rep.detach())) > 1e-6)
        if step == 0:
            self.first_step_replay_abs = float(rep.detach().abs())  # the candidate's loss: it must be 0 here
            self.first_step_gate_max = gmax
        self._report(met, fig, f"step {step}")
        self._record(step, idx, rewards, bank_sel, parts, gates, gmax > 0, total, rep_norm, total_norm)

    @torch.no_grad()
    def _replay_figures(self, bank_sel, parts) -> dict:
        """The update's replay by the float64 loops of reference.py on the bank log-probs that crossed: the
        supervisor's gates, weights and loss (what the run judges), never the loss's metrics dict."""
        lt, lb = parts["bank_logp"], parts["bank_base_logp"]
        if lt is None or lb is None:
            z = torch.zeros(0, dtype=torch.float64)
            return {"loss": 0.0, "grad": None, "gates": z, "weights": torch.zeros(0, 1, dtype=torch.float64),
                    "mean_delta": z, "mask": None}
        m = bank_sel.mask.bool().cpu()
        lt64, lb64 = lt.detach().double().cpu(), lb.detach().double().cpu()
        loss, grad, gates, weights = ref.replay_reference(lt64.tolist(), lb64.tolist(), m.tolist())
        n = m.sum(1)
        delta = torch.where(m, lb64 - lt64, torch.zeros_like(lt64))
        mean_delta = torch.tensor([math.fsum(row) for row in delta.tolist()], dtype=torch.float64) / n.clamp_min(1)
        return {"loss": loss, "grad": torch.tensor(grad, dtype=torch.float64).reshape(lt64.shape),
                "gates": torch.tensor(gates, dtype=torch.float64),
                "weights": torch.tensor(weights, dtype=torch.float64).reshape(lt64.shape),
                "mean_delta": mean_delta, "mask": m}

    def _report(self, met, fig, where: str) -> None:
        """adaptive_replay_loss's metrics beside the float64 loop's figures (the reported_metrics contract)."""
        if fig["mask"] is None:
            return
        met = met if isinstance(met, dict) else {}
        gates, weights = fig["gates"], fig["weights"]
        B = int(gates.numel())
        ambiguous = int((fig["mean_delta"].abs() <= DELTA_ROUNDING).sum())
        want = {"gates": gates, "mean_delta": fig["mean_delta"], "token_weights": weights,
                "weight_sum": weights.sum(1), "active_fraction": float((gates > 0).double().mean()) if B else 0.0,
                "num_trajectories": B}
        audit = run_audit.of(self.ctx)
        for key in REPORTED:
            audit.report(arm="tar", function="adaptive_replay_loss", key=key, reported=met.get(key),
                         measured=want[key], slack=ambiguous / max(B, 1) if key == "active_fraction" else 0.0,
                         where=where)

    def scored(self, roll, bank_sel, parts) -> list:
        """What the update's total loss was computed from, for the gradient audit: the full-vocabulary
        log-distributions of the sampled tokens (the GRPO and KL terms read them; the supervisor scored them) and
        the bank log-probs (the candidate's bank_logprobs scored them through a handle)."""
        out = [audited.responses("logdist", parts["logdist"], roll.prompts, roll.responses, roll.mask, full=True)]
        if parts["bank_logp"] is not None:
            out.append(audited.responses("bank_logp", parts["bank_logp"], bank_sel.prompts, bank_sel.responses,
                                         bank_sel.mask))
        return out

    def backward_done(self, upstream) -> None:
        """After the update's backward: the gradient that reached the bank log-probs in it against
        lambda_rep * the float64 loop's d L_rep / d logp_theta, relative to its largest entry."""
        fig, self._replay = self._replay, None
        if fig is None or fig["grad"] is None:
            return
        want = self.lambda_rep * fig["grad"]
        g = upstream.get("bank_logp")
        got = torch.zeros_like(want) if g is None else g.detach().double().cpu()
        if got.shape != want.shape:
            self.replay_grad_err = math.inf
            return
        scale = max(float(want.abs().max()), 1e-30)
        self.replay_grad_err = max(self.replay_grad_err, _bad(float((got - want).abs().max()) / scale))

    @torch.no_grad()
    def _selection(self, idx, bank_sel, parts) -> None:
        """B_rep must be exactly the bank entries of the update's own prompts, in bank order: the rows the replay
        was scored on (and, when it ran, the mask its loss used) against a loop over the bank."""
        bank, own = self._bank, {int(p) for p in idx.tolist()}
        want = [r for r, p in enumerate(bank.prompt_index.tolist()) if int(p) in own]
        self.replayed_rows += len(want)
        self.other_prompt_rows += int(bank.prompt_index.numel()) - len(want)
        w = torch.tensor(want, dtype=torch.long, device=bank.prompt_index.device)
        same = (bank_sel.responses.shape == bank.responses[w].shape
                and all(torch.equal(getattr(bank_sel, f), getattr(bank, f)[w])
                        for f in ("prompt_index", "prompts", "responses", "mask")))
        lt = parts["bank_logp"]
        same = same and (lt is None and not want or lt is not None and lt.shape[0] == len(want))
        self.selection_mismatch += int(not same)

    @torch.no_grad()
    def _harness(self, roll, bank_sel, parts, rep_norm: float) -> None:
        lt, lb = parts["bank_logp"], parts["bank_base_logp"]
        if lb is not None:
            m = bank_sel.mask.bool()
            zero = torch.zeros((), dtype=torch.float64, device=m.device)
            for got, model, name in ((lb, self.base, "bank_base_err"), (lt, self.policy, "bank_policy_err")):
                want, _ = sequence_logprobs(model, bank_sel.prompts, bank_sel.responses)
                diff = torch.where(m, (got.detach().double() - want.double()).abs(), zero)
                setattr(self, name, max(getattr(self, name), _bad(float(diff.max()) if diff.numel() else 0.0)))
            self.replay_err = max(self.replay_err, _bad(abs(float(parts["replay"].detach()) - self._replay["loss"])))
        lt, lq = parts["logdist"].detach().double(), parts["base_logdist"].double()
        m = roll.mask.bool()
        fwd_tok = (lt.exp() * (lt - lq)).sum(-1)
        rev_tok = (lq.exp() * (lq - lt)).sum(-1)
        n = int(m.sum())
        fwd = float(torch.where(m, fwd_tok, torch.zeros_like(fwd_tok)).sum()) / n
        rev = float(torch.where(m, rev_tok, torch.zeros_like(rev_tok)).sum()) / n
        kl = float(parts["kl"].detach())
        self.kl_err = max(self.kl_err, _bad(abs(kl - fwd)))
        self.kl_gap = max(self.kl_gap, abs(fwd - rev))
        self.kl_min = min(self.kl_min, _bad(kl))
        gates = self._replay["gates"]
        gmax = float(gates.max()) if gates.numel() else 0.0
        self.max_gate = max(self.max_gate, gmax)
        if gmax > GATE_NOISE and rep_norm > 0:
            self.fired_steps += 1
            self.max_fired_grad = max(self.max_fired_grad, rep_norm)

    def _record(self, step, idx, rewards, bank_sel, parts, gates, active, total, rep_norm, total_norm) -> None:
        rep, fig = parts["replay"], self._replay
        valid = bank_sel.mask.cpu().bool()
        w = fig["weights"]
        wv = w[valid] if w.shape == valid.shape else torch.zeros(0, dtype=torch.float64)
        self.ctx.record_step(
            step=step + 1,
            phase="update",
            prompts=idx.tolist(),
            replay_bank_prompts=bank_sel.prompt_index.tolist(),
            reward_mean=float(rewards.mean()),
            bank_rows=int(bank_sel.responses.shape[0]),
            replay_active=active,
            active_fraction=float((gates > 0).double().mean()) if gates.numel() else 0.0,
            gates=gates.tolist(),
            mean_delta=fig["mean_delta"].tolist(),
            token_weight_mean=float(wv.mean()) if wv.numel() else 0.0,
            token_weight_max=float(wv.max()) if wv.numel() else 0.0,
            token_weight_positive_fraction=float((wv > 0).double().mean()) if wv.numel() else 0.0,
            grpo_loss=float(parts["grpo"].detach()),
            kl_to_base=float(parts["kl"].detach()),
            replay_loss=float(rep.detach()),
            total_loss=float(total.detach()),
            replay_grad_norm=rep_norm,
            total_grad_norm=total_norm,
        )

    # --- the result ------------------------------------------------------------------------

    def measurements(self) -> dict:
        base_grads = sum(int(q.grad is not None) for q in self.base.parameters())
        return {
            "actor_param_l2_change": param_l2_change(self.policy_before, self.policy),
            "min_step_grad_norm": self.min_total_grad,
            "nonzero_grad_steps": self.nonzero_grad_steps,
            "grpo_grad_max_norm": self.grpo_grad_max,
            "kl_grad_max_norm": self.kl_grad_max,
            "total_grad_composition_max_rel_err": self.composition_err,
            "base_param_l2_change": param_l2_change(self.base_before, self.base),
            "base_params_with_grad": base_grads,
            "base_trainable_params": self.base_trainable,
            **self.m,
            "actor_inputs_reward_invariant": bool(self.inputs_invariant),
            "reward_shift_grad_max_abs_diff": self.shift_diff,
            "first_step_replay_loss_abs": self.first_step_replay_abs,
            "first_step_gate_max": self.first_step_gate_max,
            "replay_active_steps": self.active_steps,
            "active_steps_with_zero_replay_grad": self.active_zero_grad,
            "inactive_steps_with_nonzero_replay": self.inactive_nonzero_replay,
            "sampled_tokens": self.ctx.meter.tokens,
            "encoder_max_abs_err": self.encoder_err,
            "bank_fps_mismatch": self.fps_mismatch,
            "padded_candidates": self.padded_candidates,
            "bank_base_logp_max_abs_err": self.bank_base_err,
            "bank_policy_logp_max_abs_err": self.bank_policy_err,
            "replay_reference_max_abs_err": self.replay_err,
            "kl_max_abs_err": self.kl_err,
            "kl_direction_gap": self.kl_gap,
            "kl_min": self.kl_min,
            "replay_fired_steps": self.fired_steps,
            "replay_selection_mismatch_steps": self.selection_mismatch,
            "replayed_bank_rows": self.replayed_rows,
            "bank_rows_of_other_prompts": self.other_prompt_rows,
            "replay_max_gate": self.max_gate,
            "run_replay_grad_max_rel_err": self.replay_grad_err,
            "replay_fired_max_grad_norm": self.max_fired_grad,
        }
