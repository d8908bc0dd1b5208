"""The gate's `depends:<method>` requirements: every spec a method depends on (`depends_on:`, transitively) holds
on this very source tree.

TAPO, MRTPO and TAR each train a GRPO control arm beside the method's arm with the code specs/grpo.yaml checks; a
bug there (EOS dropped from the sampler's mask, a clip without its upper bound) leaves the method's own contracts
green. So a dependent's gate also asks, per dependency, what that dependency's own gate asks of a check run: on
each device the dependency's spec requires, every contract passed for every budget seed and dtype in fresh
receipts of its registered implementation, none failed, and (when its spec requires it) every mutant killed.
Fresh means every file each receipt binds is as it is now, so the dependency's evidence and the dependent's are
of the same source tree. Review, formal comparison and mutation score stay the dependency's own business (the
control is checked, not promoted).

Under a trust policy only receipts it trusts count, as for the method's own requirements. Never imports torch.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

from engine.spec import depends


def requirements(spec, receipts_dir: Path, root: Path, specs_dir: Path, flags: str, policy, req, fix,
                 counted, device, mutants, command, assessed_of, validate=None) -> list[dict]:
    """One requirement per dependency of `spec` (dependencies first); the helpers are engine.gate.verdict's
    (passed in, so the requirement is judged exactly as the dependency's own gate would judge its receipts).
    `validate(path, root)` validates a spec file as the caller validated `spec` (a reading verb: from the user's
    sealed cache, engine.store.sealed.validate_spec); by default engine.spec.memo.validate_file."""
    if validate is None:
        from engine.spec.memo import validate_file as validate
    keys = depends.closure(spec.key, specs_dir, root, read=lambda path: depends.keys_of(path, root, validate))
    own = [d.method for d in depends.declared(spec.data)]
    keys += [k for k in own if k not in keys]  # a declared dependency with no spec in the folder is reported too
    dep_flags = _without_impl(flags)
    return [_one(key, spec.key, root, specs_dir, dep_flags, policy, req, fix, counted, device, mutants, command,
                 assessed_of, validate) for key in keys]


def _without_impl(flags: str) -> str:
    """The dependency is checked as registered (the control arm runs the registered code): no --impl."""
    out, rest = [], iter(shlex.split(flags))
    for tok in rest:
        if tok == "--impl":
            next(rest, None)
        elif not tok.startswith("--impl="):
            out.append(tok)
    return "".join(" " + shlex.quote(t) for t in out)


def _one(key: str, dependent: str, root: Path, specs_dir: Path, flags: str, policy, req, fix, counted, device,
         mutants, command, assessed_of, validate) -> dict:
    from engine.spec.registry import implementation_file

    rid = f"depends:{key}"
    path = Path(specs_dir) / f"{key}.yaml"
    base = {"dependency": key, "receipts": [], "parts": []}
    if not path.is_file():
        return req(rid, False, f"{dependent} depends on {key}, which has no spec in {_shown(specs_dir, root)}",
                   fix(note=f"add specs/{key}.yaml or remove {key} from depends_on in {dependent}'s spec"), **base)
    dep, errors = validate(path, root)
    if dep is None:
        return req(rid, False, f"the spec of {key} does not validate: {errors[0].line()}",
                   fix(note=f"fix it (contracts validate {_shown(path, root)}), then check {key}"), **base)
    assessed = assessed_of(key)
    usable, untrusted, fresh, refused = counted(assessed, f"specs/{path.name}", "default", policy,
                                                implementation_file(dep.data["implementation"]))
    stale = [a for a in usable if a.state == "stale"]
    cmd = command(key, flags, policy)
    devices = list(dep.data["promotion"]["requires"]["devices"])
    parts = [device(dep, d, fresh, stale, cmd, untrusted, refused) for d in devices]
    relevant = [a for a in fresh if a.device in devices]
    if dep.data["promotion"]["requires"]["mutants_killed"]:
        parts.append(mutants(dep, relevant, devices, cmd))
    met = all(p["met"] for p in parts)
    used = sorted({r for p in parts if p["met"] for r in p.get("receipts", [])})
    summary = [{"id": p["id"], "met": p["met"], "detail": p["detail"]} for p in parts]
    if met:
        detail = (f"{key} holds on this tree: " + "; ".join(f"{p['id']} {p['detail']}" for p in parts))
        return req(rid, True, detail, dependency=key, receipts=used, parts=summary)
    unmet = [p for p in parts if not p["met"]]
    if not relevant:  # no fresh receipt at all: what the mutants lack says nothing more
        unmet = [p for p in unmet if p["id"] != "mutants_killed"]
    failing = any(p.get("failed") or p.get("run_errors") for p in parts)
    detail = (f"{dependent}'s evidence rests on {key}, which "
              + ("fails" if failing else "is not shown to hold") + " on this tree: "
              + "; ".join(f"{p['id']} {p['detail']}" for p in unmet))
    first = unmet[0]
    how = {"fix": first["fix"], "argv": first.get("argv"), "note": first.get("note", "")}
    return req(rid, False, detail, how, dependency=key, receipts=sorted({r for p in parts for r in p.get("receipts", [])}),
               parts=summary)


def _shown(path: Path, root: Optional[Path]) -> str:
    from engine.spec.loader import display_path

    return display_path(Path(path), root)
