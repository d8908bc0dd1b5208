"""refusal: a table of argument mutations, each refused with the declared exception; edge inputs accepted."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind

MUTATION = {
    "type": "object", "additionalProperties": False, "required": ["arg"],
    "properties": {
        "arg": {"type": "string", "description": "input name, kwarg name, or argument position as a string"},
        "value": {"description": "replace the argument by this literal"},
        "fill": {"oneOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}],
                 "description": "write this into the argument (all of it, or `at`)"},
        "at": {"oneOf": [{"enum": ["all", "first_valid", "row0"]},
                         {"type": "object", "additionalProperties": False, "required": ["rows"],
                          "properties": {"rows": {"type": "array", "minItems": 2, "maxItems": 2,
                                                  "items": {"type": "integer", "minimum": 0}}}}],
               "description": "where `fill` goes: all, first_valid (the first True slot of `mask`), row0, "
                              "{rows: [lo, hi]}"},
        "from": {"type": "string", "description": "replace the argument by this other input first"},
        "masked_fill": {"oneOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}],
                        "description": "then write this into the slots `mask` masks (junk that must not count)"},
        "empty": {"enum": ["columns", "mask"], "description": "zero-width last dim / an all-False mask"},
        "cast": {"enum": ["long", "float", "bool"]},
        "raises": {"enum": ["ValueError", "TypeError", "RuntimeError", "any"]},
        "match": {"type": "string", "description": "a word the message must contain (case-insensitive)"},
        "note": {"type": "string"},
        "same": {"type": "boolean", "description": "accepted, the declared output must equal the unmutated "
                 "call's bit for bit (a 0/1 float mask means the bool mask)"},
    },
}


@kind
class Refusal(Kind):
    name = "refusal"
    description = ("A table of argument mutations (OpInfo's error inputs), each of which must raise the declared "
                   "exception (and name the declared word), and a table of edge inputs that must be accepted.")
    parameters = {**CALL,
                  "mask": NAME,
                  "refuse": {"type": "array", "items": {"oneOf": [MUTATION, {"type": "array", "items": MUTATION}]}},
                  "accept": {"type": "array", "items": {"oneOf": [MUTATION, {"type": "array", "items": MUTATION}]}}}
    required = CALL_REQUIRED
    metrics = {"refused": "mutations refused as declared", "not_refused": "mutations that were not",
               "accepted": "edge inputs accepted", "wrongly_refused": "edge inputs refused",
               "accepted_differs": "accepted edge inputs marked `same` whose output differs from the unmutated "
               "call's", "cases": "rows"}

    def measure(self, impl, ctx, params):
        from engine.spec.registry import NotProvided

        import torch

        from engine.kinds import calls

        errors = {"ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError,
                  "any": Exception}
        from engine.kinds import inputs as inputs_mod

        drawn, _ = inputs_mod.draw(params["inputs"], ctx.seed, 0, ctx)
        base = calls.cast_all(ctx, drawn)
        mask = drawn.get(params.get("mask") or "mask")
        counts = {"refused": 0, "not_refused": 0, "accepted": 0, "wrongly_refused": 0, "accepted_differs": 0}
        skipped = {"refuse": 0, "accept": 0}
        unmutated = []

        def same_as_unmutated(out) -> bool:
            if not unmutated:
                with torch.no_grad():
                    unmutated.append(calls.select(calls.call(impl, params, dict(base), output=None),
                                                  params.get("output")))
            want, got = unmutated[0], calls.select(out, params.get("output"))
            if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
                return want.shape == got.shape and want.dtype == got.dtype and bool(
                    torch.equal(torch.nan_to_num(want.detach()), torch.nan_to_num(got.detach())))
            return want == got

        def mutate(muts):
            t = dict(base)
            kw = dict(params.get("kwargs") or {})
            p = {**params, "kwargs": kw}
            for mu in (muts if isinstance(muts, list) else [muts]):
                a = mu["arg"]
                if a not in t and a not in [x for x in params.get("args", []) if isinstance(x, str)]:
                    if "value" in mu:
                        kw[a] = {"value": mu["value"]}
                        continue
                if "value" in mu:
                    if a in t:
                        t[a] = mu["value"]
                    continue
                x = t[mu["from"]] if "from" in mu else t[a]
                if "fill" in mu:
                    x = x.clone()
                    v = float(mu["fill"])
                    at = mu.get("at", "all")
                    if at == "all":
                        x.fill_(v)
                    elif at == "row0":
                        x[0] = v
                    elif isinstance(at, dict):
                        x[at["rows"][0]: at["rows"][1]] = v
                    else:
                        pos = mask.nonzero()[0].tolist()
                        if x.dim() == 1:
                            x[pos[0]] = v
                        else:
                            x[tuple(pos)] = v
                if "masked_fill" in mu:
                    m_dev = calls.on_device(ctx, mask)
                    x = torch.where(m_dev, x, torch.full_like(x, float(mu["masked_fill"])))
                if mu.get("empty") == "columns":
                    x = x[..., :0]
                elif mu.get("empty") == "mask":
                    x = torch.zeros_like(x)
                if mu.get("cast"):
                    x = x.to({"long": torch.int64, "float": ctx.dtype, "bool": torch.bool}[mu["cast"]])
                t[a] = x
            if any(isinstance(mu, dict) and mu.get("empty") == "columns" for mu in (muts if isinstance(muts, list) else [muts])):
                t = {k: (v[..., :0] if isinstance(v, torch.Tensor) and mask is not None and v.shape == mask.shape else v)
                     for k, v in t.items()}
            return p, t

        def describe(muts):
            muts = muts if isinstance(muts, list) else [muts]
            return "; ".join(mu.get("note") or ", ".join(f"{k}={v}" for k, v in mu.items()) for mu in muts)

        only = getattr(ctx, "only_case", None)
        row = -1
        for table, refusing in (("refuse", True), ("accept", False)):
            for muts in params.get(table) or []:
                row += 1
                if only is not None and row != only:
                    continue
                p, t = mutate(muts)
                row_muts = muts if isinstance(muts, list) else [muts]
                # a row's declared exception and word, wherever in its list of mutations they are written
                raises = next((mu["raises"] for mu in row_muts if "raises" in mu), "ValueError")
                match = next((mu["match"] for mu in row_muts if "match" in mu), "")
                want = errors[raises]
                outcome, message = "accepted", ""
                try:
                    out = calls.call(impl, p, t, output=None)
                    if hasattr(out, "__next__"):
                        next(out)
                except NotProvided as e:
                    # this implementation cannot take the row (no such function or argument): the row is not
                    # measured, so the contract is partial (or not applicable if no row was), never a missed refusal
                    skipped[table] += 1
                    for metric in (("not_refused", "refused") if refusing else
                                   ("wrongly_refused", "accepted", "accepted_differs")):
                        ctx.not_applicable(str(e), metric)
                    continue
                except want as e:
                    outcome, message = "raised", str(e)
                except Exception as e:  # noqa: BLE001 - another exception type is not the documented refusal:
                    # recorded below with its type and message, as the row's failure
                    outcome, message = f"raised {type(e).__name__}", str(e)
                if refusing:
                    ok = outcome == "raised" and match.lower() in message.lower()
                    counts["refused" if ok else "not_refused"] += 1
                    metric = "not_refused"
                else:
                    ok = outcome == "accepted"
                    counts["accepted" if ok else "wrongly_refused"] += 1
                    metric = "wrongly_refused"
                    if ok and any(mu.get("same") for mu in row_muts) and not same_as_unmutated(out):
                        ok, outcome, metric = False, "accepted with another result", "accepted_differs"
                        counts["accepted_differs"] += 1
                log = getattr(ctx, "case_log", None)
                if log is not None:
                    log.append({"seed": ctx.seed, "case": row, "shapes": {k: list(v.shape) for k, v in t.items()
                                                                         if isinstance(v, torch.Tensor)},
                                "metrics": {metric: 0 if ok else 1}, "argument": f"{table}: {describe(muts)}"
                                + ("" if ok else f" ({_what_happened(outcome, message, raises, match)})")})
        out = {**counts, "cases": row + 1}
        if skipped["refuse"] and not counts["refused"] + counts["not_refused"]:
            del out["not_refused"], out["refused"]
        if skipped["accept"] and not counts["accepted"] + counts["wrongly_refused"]:
            del out["wrongly_refused"], out["accepted"], out["accepted_differs"]
        return out


def _what_happened(outcome: str, message: str, raises: str, match: str) -> str:
    """What a failing row got instead of the declared outcome: `accepted (returned)`, `raised TypeError, not
    ValueError: 'msg'`, `raised ValueError without 'mask': 'msg'` (the message cut to one short line)."""
    shown = " ".join(message.split())
    shown = repr(shown if len(shown) <= 120 else shown[:117] + "...")
    if outcome == "accepted":
        return "accepted: returned without raising"
    if outcome == "raised":
        return f"raised {raises} without {match!r}: {shown}" if match else f"raised {raises}: {shown}"
    return f"{outcome}, not {raises}: {shown}"
