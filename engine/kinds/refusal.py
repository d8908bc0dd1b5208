"""refusal: a table of argument mutations, each refused with the declared exception; edge inputs accepted and,
where declared, answered correctly."""

from __future__ import annotations

import math
import re
from typing import Any

from engine.kinds.base import ARG, CALL, CALL_REQUIRED, NAME, NUMBER, Kind, kind

FILL = {"oneOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf", "max", "-max"]}]}
# An index as Python writes it inside brackets: ":, :-1", "0", "None, :0", "1, :, :-1".
_PART = r"\s*(None|\.\.\.|-?[0-9]*(:-?[0-9]*){0,2})\s*"
INDEX = {"type": "string", "pattern": f"^{_PART}(,{_PART})*$"}
# An input, optionally indexed: "logp_loo", "logp_loo[1][:, :-1]".
EXPR = {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,63}(\[[^\]]*\])*$"}
DTYPES = ["long", "float", "bool", "float64", "float32", "float16", "bfloat16", "int64", "int32", "complex64"]
PREFIX = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1,
                                                         "items": {"type": "string", "minLength": 1}}]}

# What an accepted call's result must be: at `path` (indices and dict keys into the whole result; [] is all of it).
RETURNS = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "path": {"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "string"}]}},
        "equals": {"description": "a number or bool (every element), or a nested list (the tensor)"},
        "equals_input": {**NAME, "description": "equal, value for value, to this input as drawn"},
        "same": {"oneOf": [{"const": True}, INDEX],
                 "description": "equal bit for bit to the unmutated call's value at the same path (a string: "
                                "that value indexed so, e.g. ':1')"},
        "where": {**NAME, "description": "compare only where this bool input is True (aligned on the left)"},
        "tol": {"type": "number", "minimum": 0, "description": "absolute tolerance of `equals` (default 0)"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "dtype": {"enum": ["float64", "float32", "float16", "bfloat16", "int64", "int32", "bool"]},
        "len": {"type": "integer", "minimum": 0, "description": "the number of items (a generator is run out)"},
        "finite": {"const": True},
    },
}

MUTATION = {
    "type": "object", "additionalProperties": False, "required": ["arg"],
    "properties": {
        "arg": {"type": "string", "description": "input name, kwarg name, or argument position as a string"},
        "call": {**NAME, "description": "the row calls this entry of `calls` instead of the contract's function"},
        "value": {"description": "replace the argument by this literal"},
        "omit": {"const": True, "description": "leave this keyword argument out (its default applies)"},
        "from": {**EXPR, "description": "replace the argument by this other input (optionally indexed) first"},
        "items": {"type": "array", "maxItems": 16, "items": EXPR,
                  "description": "replace the argument by a Python list of these inputs (optionally indexed)"},
        "index": {**INDEX, "description": "then index it, as Python would inside brackets: ':, :-1', '0', 'None, :0'"},
        "fill": {**FILL, "description": "write this into the argument (all of it, or `at`); max: the dtype's "
                                        "largest finite value; a number argument becomes this float"},
        "at": {"oneOf": [{"enum": ["all", "first_valid", "row0"]},
                         {"type": "object", "additionalProperties": False, "required": ["rows"],
                          "properties": {"rows": {"type": "array", "minItems": 2, "maxItems": 2,
                                                  "items": {"type": "integer", "minimum": 0}}}},
                         {"type": "object", "additionalProperties": False, "required": ["index"],
                          "properties": {"index": {"type": "array", "minItems": 1, "items": {
                              "type": "array", "minItems": 1, "items": {"type": "integer"}}}}}],
               "description": "where `fill` goes: all, first_valid (the first True slot of `mask`), row0, "
                              "{rows: [lo, hi]}, {index: [[i], [i, j], ...]} (positions, a prefix fills a row)"},
        "masked_fill": {**FILL, "description": "then write this into the slots `mask` masks (junk that must not count)"},
        "empty": {"enum": ["columns", "mask"], "description": "zero-width last dim / an all-False mask"},
        "cast": {"enum": DTYPES, "description": "then cast (float: the dtype under test)"},
        "scale": {**NUMBER, "description": "then multiply by this"},
        "row_max": {"enum": ["top"], "description": "then rescale each row (last dim) so its largest |x| is "
                    "min(finfo.max / 8 / sqrt(D), 1e150): near the top of the dtype's range, float64 norms finite"},
        "requires_grad": {"const": True, "description": "then make it a leaf that requires grad"},
        "device": {"const": "cpu", "description": "then move it to the CPU (the row runs only on another device)"},
        "no_grad": {"const": True, "description": "the row's call runs under torch.no_grad()"},
        "raises": {"enum": ["ValueError", "TypeError", "RuntimeError", "any"]},
        "match": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}],
                  "description": "word(s) the message must contain (case-insensitive); declared by the interface"},
        "note": {"type": "string"},
        "same": {"type": "boolean", "description": "accepted, the declared output must equal the unmutated "
                 "call's bit for bit (a 0/1 float mask means the bool mask); with `grad_wrt`, the gradients too"},
        "same_as": {"oneOf": [{"$ref": "#/$defs/mutation"}, {"type": "array", "minItems": 1,
                                                              "items": {"$ref": "#/$defs/mutation"}}],
                    "description": "accepted, the output must equal bit for bit that of the call with these "
                                   "mutations instead"},
        "reference": {"type": "string", "pattern": "^[a-z][a-z0-9_.]{0,63}$",
                      "description": "accepted, the output must agree with this float64 reference on the mutated "
                                     "inputs within tol * max(1, max |reference|)"},
        "tol": {"type": "number", "minimum": 0, "description": "tolerance of `reference` (default 0)"},
        "returns": {"type": "array", "minItems": 1, "maxItems": 8, "items": RETURNS,
                    "description": "accepted, what the result must hold"},
    },
}

ROW = {"oneOf": [{"$ref": "#/$defs/mutation"}, {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/mutation"}}]}

CALL_ENTRY = {
    "type": "object", "additionalProperties": False, "required": ["function", "args"],
    "properties": {"function": CALL["function"], "args": CALL["args"], "kwargs": CALL["kwargs"],
                   "output": CALL["output"],
                   "message_prefix": {**PREFIX, "description": "this call's refusals start with one of these and "
                                                               "are one line"}},
}


@kind
class Refusal(Kind):
    name = "refusal"
    description = ("A table of argument mutations (OpInfo's error inputs), each of which must raise the declared "
                   "exception (and name the declared word), and a table of edge inputs that must be accepted, "
                   "each with the answer it must give where declared.")
    parameters = {**CALL,
                  "mask": NAME,
                  "calls": {"type": "object", "maxProperties": 8, "additionalProperties": CALL_ENTRY,
                            "propertyNames": NAME,
                            "description": "other functions a row may call (`call: NAME`), on the same inputs"},
                  "message_prefix": {**PREFIX, "description": "each refusal of the contract's function starts "
                                                              "with one of these and is one line"},
                  "grad_wrt": {"type": "array", "maxItems": 4, "items": NAME,
                               "description": "`same` and `same_as` also compare d sum(output) / d these inputs"},
                  "refuse": {"type": "array", "items": ROW},
                  "accept": {"type": "array", "items": ROW}}
    required = CALL_REQUIRED
    metrics = {"refused": "mutations refused as declared", "not_refused": "mutations that were not",
               "accepted": "edge inputs accepted", "wrongly_refused": "edge inputs refused",
               "accepted_differs": "accepted edge inputs whose answer is not the declared one (`same`, `same_as`, "
               "`reference`, `returns`)", "cases": "rows"}

    @classmethod
    def schema(cls) -> dict[str, Any]:
        out = super().schema()
        out["$defs"] = {"mutation": MUTATION}
        return out

    def measure(self, impl, ctx, params):
        return _Table(impl, ctx, params).run()


_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError, "any": Exception}
_ROW_KEYS = ("call", "raises", "match", "same", "same_as", "reference", "tol", "returns", "no_grad")


def parse_index(text: str) -> tuple:
    """':, :-1' -> (slice(None), slice(None, -1)); '0' -> (0,); 'None, :0' -> (None, slice(None, 0))."""
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    out: list[Any] = []
    for p in parts:
        if p == "None":
            out.append(None)
        elif p == "...":
            out.append(Ellipsis)
        elif ":" in p:
            bits = [int(b) if b.strip() else None for b in p.split(":")]
            out.append(slice(*bits))
        else:
            out.append(int(p))
    return tuple(out)


def _pick(expr: str, tensors: dict[str, Any]) -> Any:
    """`name` or `name[...][...]`: an input, indexed."""
    name = expr.split("[", 1)[0]
    x = tensors[name]
    for idx in re.findall(r"\[([^\]]*)\]", expr):
        x = x[parse_index(idx)]
    return x


def _row_key(muts: list[dict], key: str, default: Any = None) -> Any:
    return next((mu[key] for mu in muts if key in mu), default)


class _Table:
    """One run of a refusal contract: the rows of both tables on one seed's inputs."""

    def __init__(self, impl, ctx, params):
        from engine.kinds import calls
        from engine.kinds import inputs as inputs_mod

        self.impl, self.ctx, self.params = impl, ctx, params
        drawn, _ = inputs_mod.draw(params["inputs"], ctx.seed, 0, ctx)
        self.base = calls.cast_all(ctx, drawn)
        self.mask = drawn.get(params.get("mask") or "mask")
        self.unmutated: dict[str | None, Any] = {}

    # --- the calls -----------------------------------------------------------------------------------------
    def call_params(self, name: str | None) -> dict:
        if name is None:
            return self.params
        try:
            entry = (self.params.get("calls") or {})[name]
        except KeyError:
            from engine.errors import LookupFailure

            raise LookupFailure(f"refusal row names call {name!r}; declared calls: "
                                f"{', '.join(self.params.get('calls') or {}) or '(none)'}") from None
        return {**entry, "inputs": self.params["inputs"]}

    def mutate(self, muts: list[dict], p: dict) -> tuple[dict, dict]:
        import torch

        from engine.kinds import calls
        from engine.kinds import inputs as inputs_mod

        ctx, mask = self.ctx, self.mask
        t = dict(self.base)
        args = list(p.get("args") or [])
        kw = dict(p.get("kwargs") or {})
        p = {**p, "args": args, "kwargs": kw}
        named = {a for a in args if isinstance(a, str)} | {a for a in kw.values() if isinstance(a, str)}
        for mu in muts:
            a = mu["arg"]
            if a.isdigit():  # a position: the literal goes in place, a tensor under a name of its own
                slot = int(a)
                if "value" in mu:
                    args[slot] = {"value": mu["value"]}
                    continue
                src = args[slot]
                a = src if isinstance(src, str) else f"__arg{slot}"
                if not isinstance(src, str):
                    t[a] = src["value"]
                    args[slot] = a
            elif a not in t and a not in named:
                if mu.get("omit"):
                    kw.pop(a, None)
                    continue
                if "value" in mu:
                    kw[a] = {"value": mu["value"]}
                    continue
                kw[a] = a  # a keyword argument bound to a tensor this row makes
            elif a in kw and not isinstance(kw[a], str) and "value" not in mu:
                if mu.get("omit"):
                    kw[a] = {"value": inputs_mod.OMIT}
                    continue
                t[a] = kw[a]["value"]
                kw[a] = a
            if mu.get("omit"):
                kw[a] = {"value": inputs_mod.OMIT}
                continue
            if "value" in mu:
                if a in kw:
                    kw[a] = {"value": mu["value"]}
                else:
                    t[a] = mu["value"]
                continue
            if "items" in mu:
                t[a] = [_pick(e, t) for e in mu["items"]]
                continue
            x = _pick(mu["from"], t) if "from" in mu else t.get(a)
            if "fill" in mu and not isinstance(x, torch.Tensor):
                t[a] = _fill_value(mu["fill"], None)  # a number argument (or one left out): it becomes the fill
                continue
            if "index" in mu:
                x = x[parse_index(mu["index"])]
            if "fill" in mu:
                x = x.clone()
                v = _fill_value(mu["fill"], x)
                at = mu.get("at", "all")
                if at == "all":
                    x.fill_(v)
                elif at == "row0":
                    x[0] = v
                elif isinstance(at, dict) and "rows" in at:
                    x[at["rows"][0]: at["rows"][1]] = v
                elif isinstance(at, dict):
                    for pos in at["index"]:
                        x[tuple(pos)] = v
                else:
                    pos = mask.nonzero()[0].tolist()
                    x[pos[0] if x.dim() == 1 else tuple(pos)] = v
            if "masked_fill" in mu:
                m_dev = calls.on_device(ctx, mask)
                x = torch.where(m_dev, x, torch.full_like(x, _fill_value(mu["masked_fill"], x)))
            if mu.get("empty") == "columns":
                x = x[..., :0]
            elif mu.get("empty") == "mask":
                x = torch.zeros_like(x)
            if mu.get("cast"):
                x = x.to(_dtype(mu["cast"], ctx))
            if "scale" in mu:
                x = x * mu["scale"]
            if mu.get("row_max") == "top":
                D = x.shape[-1]
                top = min(torch.finfo(x.dtype).max / 8 / math.sqrt(D), 1e150)
                x = (x.double() / x.double().abs().amax(-1, keepdim=True) * top).to(x.dtype)
            if mu.get("requires_grad"):
                x = x.detach().clone().requires_grad_(True)
            if mu.get("device"):
                x = x.to(mu["device"])
            t[a] = x
        if any(mu.get("empty") == "columns" for mu in muts):
            t = {k: (v[..., :0] if isinstance(v, torch.Tensor) and mask is not None and v.shape == mask.shape else v)
                 for k, v in t.items()}
        return p, t

    def invoke(self, p: dict, t: dict, no_grad: bool, grads: bool = False) -> tuple[Any, list | None]:
        """The whole result (a generator run out to a list) and, with `grads`, d sum(output) / d grad_wrt."""
        import torch

        from engine.kinds import calls

        wrt = list(self.params.get("grad_wrt") or []) if grads else []
        if wrt:
            t = {k: (v.detach().clone().requires_grad_(True) if k in wrt else v) for k, v in t.items()}
        if no_grad:
            with torch.no_grad():
                out = calls.call(self.impl, p, t, whole=True)
        else:
            out = calls.call(self.impl, p, t, whole=True)
        if hasattr(out, "__next__"):
            out = list(out)
        g = None
        if wrt:
            g = [x.detach() for x in calls.grad_of(calls.select(out, p.get("output")), [t[k] for k in wrt])]
        return out, g

    def unmutated_call(self, call: str | None) -> tuple[Any, list | None]:
        if call not in self.unmutated:
            p, t = self.mutate([], self.call_params(call))
            self.unmutated[call] = self.invoke(p, t, no_grad=not self.params.get("grad_wrt"), grads=True)
        return self.unmutated[call]

    # --- the judgments -----------------------------------------------------------------------------------------
    def refused_as_declared(self, muts, p, message) -> bool:
        match = _row_key(muts, "match", "")
        words = [match] if isinstance(match, str) else list(match)
        if not all(w.lower() in message.lower() for w in words):
            return False
        prefix = p.get("message_prefix")
        if prefix:
            prefixes = (prefix,) if isinstance(prefix, str) else tuple(prefix)
            return message.startswith(prefixes) and "\n" not in message
        return True

    def answer_fault(self, muts, p, t, out, grads) -> str | None:
        """Why an accepted call's answer is not the declared one, or None."""
        import torch

        from engine.kinds import calls

        call = _row_key(muts, "call")
        value = calls.select(out, p.get("output"))
        if _row_key(muts, "same"):
            want, want_g = self.unmutated_call(call)
            if not _equal(calls.select(want, p.get("output")), value):
                return "another result than the unmutated call's"
            if want_g is not None and grads is not None and not all(_equal(a, b) for a, b in zip(want_g, grads)):
                return "another gradient than the unmutated call's"
        other = _row_key(muts, "same_as")
        if other is not None:
            other = other if isinstance(other, list) else [other]
            op, ot = self.mutate(other, p)
            want, want_g = self.invoke(op, ot, no_grad=bool(_row_key(muts, "no_grad")), grads=True)
            if not _equal(calls.select(want, op.get("output")), value):
                return "another result than the call it must equal"
            if want_g is not None and grads is not None and not all(_equal(a, b) for a, b in zip(want_g, grads)):
                return "another gradient than the call it must equal"
        ref_name = _row_key(muts, "reference")
        if ref_name:
            ref = calls.reference(p, t, ref_name)
            scale = None
            if isinstance(ref, dict):
                scale, ref = ref.get("scale"), ref["value"]
            ref, got = calls.as64(ref), calls.as64(value)
            if ref.shape != got.shape:
                return f"shape {list(got.shape)}, the reference's {list(ref.shape)}"
            ok = ~torch.isnan(ref)
            err = float((got - ref).abs()[ok].max()) if bool(ok.any()) else 0.0
            if math.isnan(err) or bool(torch.isnan(got[ok]).any()):
                err = math.inf
            if scale is None:
                scale = max(1.0, float(ref[ok].abs().max()) if bool(ok.any()) else 0.0)
            tol = float(_row_key(muts, "tol", 0.0))
            if err > tol * scale:
                return f"{err:.3g} from the reference {ref_name} (tolerance {tol:g} x {scale:.3g})"
        for r in _row_key(muts, "returns", []) or []:
            fault = self.returns_fault(r, out, call, p)
            if fault:
                return fault
        return None

    def returns_fault(self, r: dict, out: Any, call: str | None, p: dict) -> str | None:
        import torch

        path = list(r.get("path") or [])
        where = f"result{''.join(f'[{k!r}]' for k in path)}"
        x = _at(out, path)
        if "len" in r and len(x) != r["len"]:
            return f"{where} has {len(x)} items, not {r['len']}"
        if "shape" in r and (not isinstance(x, torch.Tensor) or list(x.shape) != list(r["shape"])):
            return f"{where} has shape {list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}, " \
                   f"not {r['shape']}"
        if "dtype" in r and (not isinstance(x, torch.Tensor) or str(x.dtype) != f"torch.{r['dtype']}"):
            return f"{where} has dtype {getattr(x, 'dtype', type(x).__name__)}, not {r['dtype']}"
        if r.get("finite") and not bool(torch.isfinite(torch.as_tensor(x)).all()):
            return f"{where} is not finite"
        sel = None
        if "where" in r:
            sel = self.base[r["where"]].to(torch.bool).cpu()
        if "equals" in r or "equals_input" in r:
            want = self.base[r["equals_input"]] if "equals_input" in r else r["equals"]
            if isinstance(want, bool) or (not isinstance(x, torch.Tensor) and not isinstance(want, list)):
                if isinstance(x, torch.Tensor):
                    x = x.item() if x.numel() == 1 else x
                if isinstance(want, bool) or not isinstance(x, (int, float)):
                    return None if x == want else f"{where} is {x!r}, not {want!r}"
            got = torch.as_tensor(x).detach().to("cpu", torch.float64)
            want_t = torch.as_tensor(want).detach().to("cpu", torch.float64) if isinstance(want, (list, torch.Tensor)) \
                else torch.full_like(got, float(want))
            if sel is not None:
                got, want_t = _select(got, sel), _select(want_t.expand_as(got) if want_t.dim() == 0 else want_t, sel)
            if got.shape != want_t.shape:
                return f"{where} has shape {list(got.shape)}, not {list(want_t.shape)}"
            err = float((got - want_t).abs().max()) if got.numel() else 0.0
            if not err <= float(r.get("tol", 0.0)):
                return f"{where} is {err:.3g} from {r.get('equals_input') or r.get('equals')!r}"
        if "same" in r:
            want = _at(self.unmutated_call(call)[0], path)
            if isinstance(r["same"], str):
                want = want[parse_index(r["same"])]
            if not _equal(want, x):
                return f"{where} differs from the unmutated call's" + (f"[{r['same']}]" if isinstance(r["same"], str)
                                                                        else "")
        return None

    def not_measured(self, table: str, reason: str) -> None:
        for metric in (("not_refused", "refused") if table == "refuse" else
                       ("wrongly_refused", "accepted", "accepted_differs")):
            self.ctx.not_applicable(reason, metric)

    # --- the table ---------------------------------------------------------------------------------------------
    def run(self) -> dict:
        import torch

        from engine.kinds import calls
        from engine.spec import registry
        from engine.spec.registry import NotProvided

        ctx, params = self.ctx, self.params
        counts = {"refused": 0, "not_refused": 0, "accepted": 0, "wrongly_refused": 0, "accepted_differs": 0}
        skipped = {"refuse": 0, "accept": 0}
        only = getattr(ctx, "only_case", None)
        row = -1
        for table, refusing in (("refuse", True), ("accept", False)):
            for muts in params.get(table) or []:
                row += 1
                if only is not None and row != only:
                    continue
                muts = muts if isinstance(muts, list) else [muts]
                if any(mu.get("device") and torch.device(mu["device"]).type == torch.device(ctx.device).type
                       for mu in muts):
                    continue  # moving an input to the device it is on already mutates nothing
                call = _row_key(muts, "call")
                p = self.call_params(call)
                raises = _row_key(muts, "raises", "ValueError")
                want = _ERRORS[raises]
                outcome, message, fault, t, grads = "accepted", "", None, {}, None
                try:
                    if not registry.provides(self.impl, p["function"]):
                        raise NotProvided(p["function"], getattr(getattr(self.impl, p["function"], None),
                                                                 "not_provided", None) or "not in the implementation")
                except NotProvided as e:
                    skipped[table] += 1
                    self.not_measured(table, str(e))
                    continue
                # the row's inputs are built outside the guarded call: a spec that cannot be applied is an error of
                # the spec, never a refusal of the implementation's
                p, t = self.mutate(muts, p)
                try:
                    if refusing:
                        out = calls.call(self.impl, p, t, whole=True)
                        if hasattr(out, "__next__"):
                            next(out)
                    else:
                        out, grads = self.invoke(p, t, no_grad=bool(_row_key(muts, "no_grad")),
                                                 grads=bool(_row_key(muts, "same") or _row_key(muts, "same_as")))
                except NotProvided as e:
                    # this implementation cannot take the row (no such function or argument): the row is not
                    # measured, so the contract is partial (or not applicable if no row was), never a missed refusal
                    skipped[table] += 1
                    self.not_measured(table, str(e))
                    continue
                except want as e:
                    outcome, message = "raised", str(e)
                except Exception as e:  # noqa: BLE001 - another exception type is not the documented refusal:
                    # recorded below with its type and message, as the row's failure
                    outcome, message = f"raised {type(e).__name__}", str(e)
                if refusing:
                    ok = outcome == "raised" and self.refused_as_declared(muts, p, message)
                    counts["refused" if ok else "not_refused"] += 1
                    metric = "not_refused"
                else:
                    ok = outcome == "accepted"
                    counts["accepted" if ok else "wrongly_refused"] += 1
                    metric = "wrongly_refused"
                    if ok:
                        try:
                            fault = self.answer_fault(muts, p, t, out, grads)
                        except Exception as e:  # noqa: BLE001 - judging the answer failed (a missing key, the
                            # comparison call raised): the row's failure, named with what was raised
                            fault = f"judging its answer raised {type(e).__name__}: {_short(str(e))}"
                        if fault:
                            ok, metric = False, "accepted_differs"
                            counts["accepted_differs"] += 1
                log = getattr(ctx, "case_log", None)
                if log is not None:
                    shapes = {k: list(v.shape) for k, v in t.items() if isinstance(v, torch.Tensor)}
                    what = "" if ok else (f" (accepted with another result: {fault})" if fault
                                          else f" ({_what_happened(outcome, message, raises, muts, p)})")
                    log.append({"seed": ctx.seed, "case": row, "shapes": shapes,
                                "metrics": {metric: 0 if ok else 1},
                                "argument": f"{table}: {describe(muts, p)}{what}"})
        out = {**counts, "cases": row + 1}
        # rows this implementation cannot take leave the totals unmeasured (a count short of the table's says
        # nothing); the misses among the rows it took are still measured, in part
        if skipped["refuse"]:
            del out["refused"]
            if not counts["refused"] + counts["not_refused"]:
                del out["not_refused"]
        if skipped["accept"]:
            del out["accepted"]
            if not counts["accepted"] + counts["wrongly_refused"]:
                del out["wrongly_refused"], out["accepted_differs"]
        return out


def describe(muts: list[dict], p: dict) -> str:
    """A row as a reader would name it: its notes, else its mutations; the function it calls."""
    judged = set(_ROW_KEYS)
    text = "; ".join(mu.get("note") or ", ".join(f"{k}={v}" for k, v in mu.items() if k not in judged)
                     for mu in muts)
    return f"{p['function']}: {text}"


def _at(out: Any, path: list) -> Any:
    for k in path:
        out = out[k]
    return out


def _select(x, sel):
    """x at the True slots of `sel` (aligned on the left, broadcast over x's leading dims when sel is shorter)."""
    if sel.dim() < x.dim():
        return x.reshape(-1, *sel.shape)[:, sel]
    return x[sel]


def _equal(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = a.detach(), b.detach()
        if a.is_floating_point() or a.is_complex():  # bit for bit, NaN where NaN
            na, nb = torch.isnan(a), torch.isnan(b)
            return bool(torch.equal(na, nb)) and bool(torch.equal(a[~na], b[~nb]))
        return bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _fill_value(v: Any, x) -> float:
    import torch

    if v in ("max", "-max") and x is None:
        raise ValueError("fill: max needs a tensor argument (the largest value of its dtype)")
    if v in ("max", "-max"):
        big = torch.finfo(x.dtype).max if x.is_floating_point() else torch.iinfo(x.dtype).max
        return float(big) if v == "max" else -float(big)
    return float(v)


def _dtype(name: str, ctx):
    import torch

    if name == "float":
        return ctx.dtype
    return {"long": torch.int64, "bool": torch.bool}.get(name) or getattr(torch, name)


def _short(message: str) -> str:
    shown = " ".join(message.split())
    return repr(shown if len(shown) <= 120 else shown[:117] + "...")


def _what_happened(outcome: str, message: str, raises: str, muts: list[dict], p: dict) -> str:
    """What a failing row got instead of the declared outcome: `accepted (returned)`, `raised TypeError, not
    ValueError: 'msg'`, `raised ValueError without 'mask': 'msg'` (the message cut to one short line)."""
    shown = _short(message)
    if outcome == "accepted":
        return "accepted: returned without raising"
    if outcome == "raised":
        match = _row_key(muts, "match", "")
        words = [match] if isinstance(match, str) else list(match)
        missing = [w for w in words if w and w.lower() not in message.lower()]
        if missing:
            return f"raised {raises} without {missing[0]!r}: {shown}" if len(missing) == 1 else \
                f"raised {raises} without {missing!r}: {shown}"
        prefix = p.get("message_prefix")
        if prefix:
            first = prefix if isinstance(prefix, str) else prefix[0]
            return f"raised {raises} without the one-line prefix {first!r}: {shown}"
        return f"raised {raises}: {shown}"
    return f"{outcome}, not {raises}: {shown}"
