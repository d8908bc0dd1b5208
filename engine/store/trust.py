"""The trust policy: which public keys may attest receipts of which device kinds.

A YAML file kept by the pipeline, outside the receipt store (and best outside
the checkout: whoever writes candidate code can write both):

    keys:
      - public_key: runner.pub      # a path relative to this file, or an inline PEM
        devices: [cpu, cuda]        # device kinds this key may attest
    require: [sandboxed]            # optional: a receipt that ran candidate code counts only if it ran in
                                    # a sandbox (predicate.isolation.sandbox: bubblewrap); also
                                    # checks_in_supervisor (no contract ran beside the candidate) and
                                    # measured_in_supervisor (no result rests on a reading the candidate's
                                    # process took of itself: its budget contracts' ops and time)

    reviewers:                      # optional: keys whose signed reviews count (engine.gate.review)
      - public_key: alice.pub

Under a policy a receipt counts only when an envelope signature verifies
against a key trusted for the receipt's device kind. Every other receipt is
`unsigned`, `untrusted key` or `bad signature`, and never counted. Likewise a
review counts only when signed by a key listed under `reviewers:` (a policy
without reviewers lets no review count). A key may not be both a runner key and
a reviewer key: whatever runs candidate code must not be able to approve a spec.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import UsageError

ENV_VAR = "CONTRACTS_TRUST"
DEVICE_KINDS = ("cpu", "cuda")
MAX_POLICY_BYTES = 1 << 20
TRUSTED, UNSIGNED, UNTRUSTED, BAD_SIGNATURE = "trusted", "unsigned", "untrusted key", "bad signature"
UNSANDBOXED = "unsandboxed"
CANDIDATE_SIDE = "checked in candidate"  # a receipt a policy refuses for where its checks or measurements were
REQUIREMENTS = ("sandboxed", "checks_in_supervisor", "measured_in_supervisor")


def _isolation(payload: bytes) -> dict | None:
    """predicate.isolation of a signed Statement's bytes (read defensively: the schema is checked later)."""
    import json

    try:
        pred = json.loads(payload).get("predicate")
        iso = pred.get("isolation") if isinstance(pred, dict) else None
    except (ValueError, AttributeError, RecursionError):
        return None
    return iso if isinstance(iso, dict) else None


@dataclass(frozen=True)
class TrustPolicy:
    """A parsed trust policy: key id -> (public key, device kinds it may attest)."""

    file: str  # as given (what gate --json names)
    sha256: str  # of the policy file's bytes
    keys: dict
    reviewers: dict = field(default_factory=dict)  # key id -> public key whose signed reviews count
    require: frozenset = frozenset()  # of REQUIREMENTS

    def judge(self, signatures: list[dict] | None, payload: bytes, device: str | None) -> tuple[str, str]:
        """(TRUSTED | UNSIGNED | UNTRUSTED | BAD_SIGNATURE, why) for one receipt of `device` kind."""
        from engine.store.signing import verify_signatures

        if not signatures:
            return UNSIGNED, "unsigned: not written with --sign-key"
        kid, why = verify_signatures(payload, signatures, {k: v[0] for k, v in self.keys.items()})
        if kid is None:
            claimed = ", ".join(s["keyid"][:16] for s in signatures)
            if why == BAD_SIGNATURE:
                return BAD_SIGNATURE, f"bad signature: the signature by key {claimed} does not verify"
            return UNTRUSTED, f"untrusted key: signed by {claimed}, not a key in {self.file}"
        allowed = self.keys[kid][1]
        if device not in allowed:
            return UNTRUSTED, (f"untrusted key: key {kid[:16]} may attest {', '.join(sorted(allowed))} receipts "
                               f"in {self.file}, not {device}")
        if "sandboxed" in self.require:
            # A receipt of the registered implementation ran no candidate code; every other one (and one that
            # does not say) must have run its candidate in a sandbox.
            iso = _isolation(payload)
            if iso is None or (iso.get("candidate") is not False and iso.get("sandbox") != "bubblewrap"):
                return UNSANDBOXED, (f"unsandboxed: {self.file} requires sandboxed and this receipt's candidate ran "
                                     f"with sandbox {(iso or {}).get('sandbox', 'unrecorded')}; run it again without "
                                     "--no-sandbox")
        if self.require & {"checks_in_supervisor", "measured_in_supervisor"}:
            why = self._candidate_side(_isolation(payload))
            if why:
                return CANDIDATE_SIDE, why
        return TRUSTED, f"signed by trusted key {kid[:16]}"

    def _candidate_side(self, iso: dict | None) -> str:
        """Why a candidate receipt is refused for where its checks ran or what its candidate measured of itself
        ('' when it is not): a receipt of the registered implementation ran no candidate code."""
        if iso is not None and iso.get("candidate") is False:
            return ""
        iso = iso or {}
        if "checks_in_supervisor" in self.require and iso.get("checks_in") != "supervisor":
            beside = [str(c.get("contract")) for c in iso.get("checks_in_candidate") or [] if isinstance(c, dict)]
            return (f"checked in candidate: {self.file} requires checks_in_supervisor and this receipt's checks ran "
                    f"in {iso.get('checks_in', 'an unrecorded place')}"
                    + (f" ({', '.join(beside[:4])} beside the candidate)" if beside else ""))
        metered = [str(c.get("contract")) for c in iso.get("measured_in_candidate") or [] if isinstance(c, dict)]
        if "measured_in_supervisor" in self.require and metered:
            return (f"checked in candidate: {self.file} requires measured_in_supervisor and {', '.join(metered[:4])} "
                    "rest on readings the candidate's process took of itself (operations, time); run the check "
                    "without them (--only the other contracts) to count here")
        return ""

    def as_dict(self) -> dict:
        out = {"file": self.file, "sha256": self.sha256,
               "keys": [{"keyid": k, "devices": sorted(v[1])} for k, v in sorted(self.keys.items())],
               "reviewers": sorted(self.reviewers)}
        if self.require:  # only where a policy asks: other policies' documents keep their shape
            out["require"] = sorted(self.require)
        return out


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def load_policy(path: Path, receipts_dir: Path | None = None, shown: str | None = None) -> TrustPolicy:
    """Read and check a policy file; UsageError (exit 2) with one line naming the file, the field and the fix."""
    from engine.store.signing import key_id

    path = Path(path)
    shown = shown or str(path)
    if receipts_dir is not None and _inside(path, Path(receipts_dir)):
        raise UsageError(f"trust policy {shown} lies inside the receipt store, which whoever writes receipts can "
                         "edit; keep it with the pipeline, outside the store")
    try:
        if not path.is_file():
            raise UsageError(f"trust policy {shown}: no such file (give --trust FILE or {ENV_VAR}=FILE)")
        with open(path, "rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)
    except OSError as err:
        raise UsageError(f"trust policy {shown}: cannot read ({err.strerror or err})") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise UsageError(f"trust policy {shown}: over {MAX_POLICY_BYTES} bytes; a policy lists a few keys")
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        doc = YAML(typ="safe", pure=True).load(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"trust policy {shown}: not UTF-8 text") from None
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise UsageError(f"trust policy {shown}{where}: not valid YAML ({getattr(err, 'problem', None) or err})") \
            from None
    except RecursionError:
        raise UsageError(f"trust policy {shown}: nested too deeply to be a policy") from None
    fix = ("expected keys: [{public_key: FILE.pub or PEM, devices: [cpu, cuda]}] and optionally "
           "reviewers: [{public_key: FILE.pub or PEM}] and require: [sandboxed]")
    if not isinstance(doc, dict) or "keys" not in doc or not set(doc) <= {"keys", "reviewers", "require"}:
        raise UsageError(f"trust policy {shown} $: {fix}")
    require = doc.get("require", [])
    if not isinstance(require, list) or not all(isinstance(r, str) and r in REQUIREMENTS for r in require):
        raise UsageError(f"trust policy {shown} $.require: give a list of {', '.join(REQUIREMENTS)}")
    entries = doc["keys"]
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"trust policy {shown} $.keys: not a non-empty list ({fix})")
    keys: dict = {}
    for i, e in enumerate(entries):
        at = f"trust policy {shown} $.keys[{i}]"
        if not isinstance(e, dict) or set(e) != {"public_key", "devices"}:
            raise UsageError(f"{at}: needs exactly public_key and devices ({fix})")
        devices = e["devices"]
        if not isinstance(devices, list) or not devices or not all(d in DEVICE_KINDS for d in devices):
            raise UsageError(f"{at}.devices: give a non-empty list of {', '.join(DEVICE_KINDS)}")
        text = e["public_key"]
        key = _public_key(text, at, path, receipts_dir)
        kid = key_id(key)
        old = keys.get(kid)
        keys[kid] = (key, frozenset(devices) | (old[1] if old else frozenset()))
    reviewers: dict = {}
    listed = doc.get("reviewers", [])
    if not isinstance(listed, list):
        raise UsageError(f"trust policy {shown} $.reviewers: not a list ({fix})")
    for i, e in enumerate(listed):
        at = f"trust policy {shown} $.reviewers[{i}]"
        if not isinstance(e, dict) or set(e) != {"public_key"}:
            raise UsageError(f"{at}: needs exactly public_key ({fix})")
        key = _public_key(e["public_key"], at, path, receipts_dir)
        kid = key_id(key)
        if kid in keys:
            raise UsageError(f"{at}.public_key: key {kid[:16]} is also a runner key under keys:; a key that signs "
                             "runs of candidate code must not approve specs: give the reviewer a key of their own")
        reviewers[kid] = key
    return TrustPolicy(file=shown, sha256=hashlib.sha256(raw).hexdigest(), keys=keys, reviewers=reviewers,
                       require=frozenset(require))


def _public_key(text, at: str, path: Path, receipts_dir: Path | None):
    """The Ed25519 public key of a policy entry's public_key: a .pub path relative to the policy, or inline PEM."""
    from engine.store.signing import KeyProblem, load_public_pem

    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{at}.public_key: give a .pub file (relative to the policy) or an inline PEM")
    if text.lstrip().startswith("-----BEGIN"):
        pem, where = text.encode("utf-8"), f"{at}.public_key"
    else:
        key_path = path.parent / text
        if receipts_dir is not None and _inside(key_path, Path(receipts_dir)):
            raise UsageError(f"{at}.public_key: {text} lies inside the receipt store; keep keys with the policy")
        try:
            with open(key_path, "rb") as f:
                pem = f.read(MAX_POLICY_BYTES)
        except OSError as err:
            raise UsageError(f"{at}.public_key: cannot read {text} ({err.strerror or err}); paths are relative "
                             "to the policy file") from None
        where = f"{at}.public_key ({text})"
    try:
        return load_public_pem(pem, where)
    except KeyProblem as err:
        raise UsageError(str(err)) from None


def policy_from_option(trust: Path | None, receipts_dir: Path | None = None) -> TrustPolicy | None:
    """The policy named by --trust, else by $CONTRACTS_TRUST, else None."""
    if trust is None:
        env = os.environ.get(ENV_VAR, "")
        if not env:
            return None
        trust = Path(env)
    return load_policy(Path(trust), receipts_dir, shown=str(trust))
