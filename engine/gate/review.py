"""Reviews bound to the spec: what a review approves, how it is recorded, and when it counts.

A review approves one version of a spec's *reviewed fields*: everything in the
spec except `promotion.state` (the pointer `promote` moves), `promotion.review`
(the author's workflow status) and `promotion.reasons` (review notes). So the
contracts with their tolerances, the mutants, the equivalent mutants, the
interface, the budget, the gate's requirements, the formulas, the assumptions,
the implementation named, the paper and the evolve score are all reviewed, and
so is any field a later spec version adds (the set is defined by exclusion, so a
new field cannot slip past a review). The digest is the sha256 of the canonical
JSON of those fields: comments, quoting and layout do not change it; any value
does.

`contracts review METHOD --approve` appends a `review` entry to the promotion
ledger holding the digest and the reviewed fields themselves (so a later gate can
name what changed, e.g. `contracts[beta_schedule].expect[0].le`), signed with the
reviewer's key when one is given. The gate's `review` requirement is met only by
the newest intact ledger review of the method whose digest is the current spec's
(and, under a trust policy, whose signature verifies with a key the policy lists
under `reviewers:`); `promotion.review: DONE` must still be set, but alone it no
longer suffices.

The signature is ed25519 over the DSSE pre-authentication encoding of the review
body's canonical bytes with its own payload type, so a runner's signer (which
signs in-toto Statements only) can never produce one.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any, Callable

from engine.errors import UsageError

REVIEW_SCHEMA = "paper-contracts/review/v1"
REVIEW_PAYLOAD_TYPE = "application/vnd.paper-contracts.review+json"
FIELDS = "paper-contracts/reviewed-fields/v1"  # the rule below; changing it is a new version (every review stale)
NOT_REVIEWED = (("promotion", "state"), ("promotion", "review"), ("promotion", "reasons"))
_SHOW = 4


def _plain(v: Any) -> Any:
    """Plain JSON types, whatever YAML reader produced `v` (bool before int: a bool is an int in Python)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    return str(v)


def reviewed_fields(data: dict) -> dict:
    """The spec's data without the fields a review does not cover (NOT_REVIEWED)."""
    out = _plain(data)  # a new structure throughout (_plain rebuilds every container): `data` is never changed
    for path in NOT_REVIEWED:
        node = out
        for k in path[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def digest_of(fields: dict) -> str:
    """sha256 of the canonical form of reviewed fields (tagged with the FIELDS rule)."""
    from engine.store.receipts import canonical

    return hashlib.sha256(canonical({"fields": FIELDS, "spec": fields})).hexdigest()


def reviewed_digest(data: dict) -> str:
    """The digest a review of this spec data approves."""
    return digest_of(reviewed_fields(data))


# --- what changed ---------------------------------------------------------------------


def _keyed(items: list) -> str | None:
    """'id' (or 'name') when every item is a mapping with a distinct value for it: items are addressed by it."""
    for key in ("id", "name"):
        vals = [it.get(key) for it in items if isinstance(it, dict)]
        if len(vals) == len(items) and all(isinstance(v, str) for v in vals) and len(set(vals)) == len(vals):
            return key
    return None


def _entries(old: dict, new: dict, field: Callable[[Any], str]) -> list[dict]:
    """changed_fields entry by entry over both mappings' keys (old's order, then new's added ones); `field(key)`
    names an entry."""
    out = []
    for k in list(old) + [k for k in new if k not in old]:
        if k not in new:
            out.append({"field": field(k), "change": "removed"})
        elif k not in old:
            out.append({"field": field(k), "change": "added"})
        else:
            out += changed_fields(old[k], new[k], field(k))
    return out


def changed_fields(old: Any, new: Any, path: str = "") -> list[dict]:
    """Where `new` differs from `old`, as [{field, change}] with change modified | added | removed; list items
    with an id (or name) are addressed by it (`contracts[beta_schedule].expect[0].le`)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return _entries(old, new, lambda k: f"{path}.{k}" if path else str(k))
    if isinstance(old, list) and isinstance(new, list) and old and new and any(isinstance(x, (dict, list))
                                                                               for x in old + new):
        key = _keyed(old) if _keyed(old) == _keyed(new) else None
        if key is not None:
            out = _entries({x[key]: x for x in old}, {x[key]: x for x in new}, lambda k: f"{path}[{k}]")
            if not out:  # same items, another order
                out.append({"field": path, "change": "modified"})
            return out
        return _entries(dict(enumerate(old)), dict(enumerate(new)), lambda i: f"{path}[{i}]")
    return [{"field": path or "$", "change": "modified"}]


def describe(changes: list[dict], n: int = _SHOW) -> str:
    """'contracts[x].expect[0].le, mutants[m] (removed), +3 more'."""
    items = [c["field"] + ("" if c["change"] == "modified" else f" ({c['change']})") for c in changes]
    return ", ".join(items[:n]) + (f", +{len(items) - n} more" if len(items) > n else "")


# --- the review body and its signature -------------------------------------------------------


def pae(payload: bytes) -> bytes:
    from engine.store.signing import pae as _pae

    return _pae(REVIEW_PAYLOAD_TYPE, payload)


def body(spec, reviewer: str, note: str, at: str) -> dict:
    """What a reviewer approves and signs: the method, the spec's reviewed fields and their digest, who, why."""
    fields = reviewed_fields(spec.data)
    return {"schema": REVIEW_SCHEMA, "decision": "approve", "method": spec.key, "reviewer": reviewer, "note": note,
            "reviewed_at": at, "spec": {"file": f"specs/{spec.path.name}", "sha256": spec.sha256,
                                        "reviewed_sha256": digest_of(fields), "fields": FIELDS},
            "reviewed": fields}


def sign(body_doc: dict, key_path: Path) -> dict:
    """{keyid, sig}: ed25519 over PAE(REVIEW_PAYLOAD_TYPE, canonical body). `contracts review` runs no method code,
    so the reviewer's key is read here (unlike a check's, which only a separate signing process reads)."""
    from engine.store.receipts import canonical
    from engine.store.signing import KeyProblem, _load_private, key_id

    if not Path(key_path).is_file():
        raise UsageError(f"signing key {key_path}: no such file; make one with contracts keys generate PATH")
    try:
        key = _load_private(Path(key_path))
    except KeyProblem as err:
        raise UsageError(str(err)) from None
    sig = key.sign(pae(canonical(body_doc)))
    return {"keyid": key_id(key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}


def record(spec, receipts_dir: Path, reviewer: str, note: str, sign_key: Path | None = None, git=None) -> dict:
    """Append an approval of `spec` as it is now to the ledger (signed with `sign_key` when given); the entry."""
    from engine.store import ledger
    from engine.store.locking import PROMOTION_LOCK, exclusive
    from engine.store.receipts import utc_now

    doc = body(spec, reviewer, note, utc_now())
    signature = sign(doc, sign_key) if sign_key is not None else None
    Path(receipts_dir).mkdir(parents=True, exist_ok=True)
    with exclusive(receipts_dir, PROMOTION_LOCK):  # beside promote/demote, which read the ledger under it
        state = spec.data["promotion"]["state"]
        return ledger.append(receipts_dir, method=spec.key, action="review", old_state=state, new_state=state,
                             reason=note, by=reviewer, receipts=[], review=doc, signature=signature, git=git)


def _signature_state(entry: dict, policy) -> tuple[str, str]:
    """(trusted | unsigned | untrusted key | bad signature | unverified, why) of a review entry's signature."""
    from cryptography.exceptions import InvalidSignature

    from engine.store.receipts import canonical

    sig = entry.get("signature")
    if not sig:
        return "unsigned", "unsigned (recorded without --sign-key)"
    if not (isinstance(sig, dict) and isinstance(sig.get("keyid"), str) and isinstance(sig.get("sig"), str)):
        return "bad signature", "bad signature: not a {keyid, sig} entry"
    kid = sig["keyid"]
    if policy is None:
        return "unverified", f"signed by {kid[:16]} (not checked: no trust policy)"
    key = getattr(policy, "reviewers", {}).get(kid)
    if key is None:
        return "untrusted key", f"signed by {kid[:16]}, not a reviewer key in {policy.file}"
    try:
        key.verify(base64.b64decode(sig["sig"].encode("ascii"), validate=True), pae(canonical(entry["review"])))
    except (ValueError, UnicodeEncodeError, InvalidSignature):
        return "bad signature", f"bad signature: the signature by reviewer key {kid[:16]} does not verify"
    return "trusted", f"signed by reviewer key {kid[:16]}"


def _intact(entry: dict, method: str) -> str | None:
    """Why a ledger review entry of `method` cannot be read as one (None when it can)."""
    from engine.store.ledger import entry_digest

    if entry.get("entry_sha256") != entry_digest(entry):
        return "tampered (entry_sha256 does not match the entry)"
    b = entry.get("review")
    if not isinstance(b, dict) or b.get("schema") != REVIEW_SCHEMA or b.get("decision") != "approve":
        return f"not a {REVIEW_SCHEMA} approval"
    spec = b.get("spec")
    if b.get("method") != method or not isinstance(spec, dict) or not isinstance(b.get("reviewed"), dict):
        return "malformed review body"
    if spec.get("fields") != FIELDS:
        return f"reviewed under another field rule ({spec.get('fields')!r})"
    if digest_of(b["reviewed"]) != spec.get("reviewed_sha256"):
        return "tampered (its reviewed fields do not match its digest)"
    return None


def judge(spec, receipts_dir: Path, policy=None) -> dict:
    """Which ledger review, if any, approves the spec as it is now.

    Returns {digest, counted (entry summary or None), newest (the newest review of the method, counted or not),
    changed ([{field, change}] since the newest review when it approved another version), not_counted
    ([{seq, why}]), problems (ledger lines unreadable)}."""
    from engine.store import ledger

    digest = reviewed_digest(spec.data)
    report = ledger.read(receipts_dir)
    reviews = [e for e in report.entries if e.get("action") == "review" and e.get("method") == spec.key]
    out: dict = {"digest": digest, "counted": None, "newest": None, "changed": [], "not_counted": [],
                 "problems": list(report.problems)}
    for e in reversed(reviews):
        why = _intact(e, spec.key)
        if why:
            out["not_counted"].append({"seq": e["seq"], "why": why})
            continue
        b = e["review"]
        state, message = _signature_state(e, policy)
        summary = {"seq": e["seq"], "reviewer": b.get("reviewer"), "reviewed_at": b.get("reviewed_at"),
                   "reviewed_sha256": b["spec"]["reviewed_sha256"], "signature": state,
                   "keyid": (e.get("signature") or {}).get("keyid") if isinstance(e.get("signature"), dict) else None,
                   "message": message}
        if out["newest"] is None:
            out["newest"] = summary
        if b["spec"]["reviewed_sha256"] != digest:
            if not out["changed"] and summary is out["newest"]:
                out["changed"] = changed_fields(b["reviewed"], reviewed_fields(spec.data))
            out["not_counted"].append({"seq": e["seq"], "why": "stale: approved another version of the spec"})
            continue
        if policy is not None and state != "trusted":
            out["not_counted"].append({"seq": e["seq"], "why": message})
            continue
        out["counted"] = summary
        break
    if out["counted"] is not None:
        out["changed"] = []
    return out


def review_command(key: str, flags: str, policy) -> str:
    import shlex

    kept, rest = [], iter(shlex.split(flags))
    for tok in rest:  # a review approves the spec, whatever implementation is gated: no --impl
        if tok == "--impl":
            next(rest, None)
        elif not tok.startswith("--impl="):
            kept.append(tok)
    cmd = shlex.join(["contracts", "review", key, "--approve", "--reviewer", "NAME", "--note", "TEXT", *kept])
    if policy is not None:
        cmd += f" --sign-key KEY (a key {policy.file} lists under reviewers:)"
    return cmd


def requirement(spec, receipts_dir: Path, policy, flags: str, make) -> dict:
    """The gate's `review` requirement (make = engine.gate.verdict's requirement builder and fix)."""
    req_fn, fix = make
    status = spec.data["promotion"]["review"]
    j = judge(spec, receipts_dir, policy)
    short = j["digest"][:12]
    extra = {"reviewed_sha256": j["digest"], "review": j["counted"], "changed": j["changed"],
             "not_counted": j["not_counted"]}
    run = review_command(spec.key, flags, policy)
    if j["counted"] is not None and status == "DONE":
        c = j["counted"]
        detail = (f"review is DONE; ledger entry {c['seq']} by {c['reviewer']} ({c['reviewed_at']}) approves this "
                  f"spec's reviewed fields (sha256 {short}), {c['message']}")
        return req_fn("review", True, detail, **extra)
    parts = [] if status == "DONE" else [f"review is {status}; the gate needs DONE"]
    newest = j["newest"]
    if j["counted"] is not None:
        parts.append(f"ledger entry {j['counted']['seq']} approves this spec")
    elif newest is None and status != "DONE":
        parts[0] += " and a ledger review of this spec"
    elif newest is None:
        parts.append(f"no review in the ledger approves this spec (reviewed fields sha256 {short}); "
                     "promotion.review: DONE alone does not count")
    elif j["changed"]:
        parts.append(f"the review in ledger entry {newest['seq']} ({newest['reviewer']}, {newest['reviewed_at']}) is "
                     f"stale: the spec changed since in {describe(j['changed'])}")
    else:
        whys = "; ".join(f"entry {n['seq']}: {n['why']}" for n in j["not_counted"][:2])
        parts.append(f"no review counts for this spec ({whys})")
    note = f"a reviewer reads {spec.display}, then runs: {run}"
    if status != "DONE":
        note = f"finish the review, set promotion.review: DONE in {spec.display}, then: {run}"
    return req_fn("review", False, "; ".join(parts), fix(note=note), **extra)
