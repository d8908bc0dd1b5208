"""Signed receipts: in-toto DSSE envelopes with ed25519 keys.

A signed receipt file is a DSSE envelope (https://github.com/secure-systems-lab/dsse):

    {"payloadType": "application/vnd.in-toto+json",
     "payload": base64(the Statement's bytes, exactly as an unsigned receipt holds them),
     "signatures": [{"keyid": KEYID, "sig": base64(ed25519(PAE(payloadType, payload)))}]}

KEYID is the sha256 (hex) of the public key's 32 raw bytes, so a key is named
the same wherever it is stored.

The private key is read only by `python -m engine.store.signing sign KEY`, a
process of its own that gets the Statement bytes on stdin and writes the
envelope on stdout. It imports this module, `cryptography` and the standard
library, nothing else of the project: the process that ran the checks has
executed method (maybe candidate) code, so it hands the key's *path* on and
never opens the file itself. This module must stay importable without the rest
of `engine` (see `_signer_command`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

PAYLOAD_TYPE = "application/vnd.in-toto+json"
ENVELOPE_KEYS = frozenset({"payloadType", "payload", "signatures"})
MAX_KEY_BYTES = 64 * 1024  # a PEM ed25519 key is about 120 bytes; anything this big is not one


class KeyProblem(ValueError):
    """A key file or PEM text that is not a usable ed25519 key (one line: what and how to fix)."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def key_id(public_key) -> str:
    """sha256 (hex) of an ed25519 public key's raw 32 bytes."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_public_pem(pem: bytes, where: str):
    """An Ed25519PublicKey from PEM bytes, or KeyProblem naming `where`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return _loaded_key(lambda: serialization.load_pem_public_key(pem), Ed25519PublicKey, where,
                       "a PEM public key", "an ed25519 public key", "use the .pub file `contracts keys generate` wrote")


def _loaded_key(load, want: type, where: str, form: str, kind: str, fix: str):
    """`load()`'s key when it is a `want`; otherwise KeyProblem naming `where`, what it is not, and `fix`."""
    try:
        key = load()
    except (ValueError, TypeError) as err:
        why = str(err).splitlines()[0] if str(err) else "unreadable"
        raise KeyProblem(f"{where}: not {form} ({why}); {fix}") from None
    if not isinstance(key, want):
        raise KeyProblem(f"{where}: a {type(key).__name__}, not {kind}; {fix}")
    return key


def _load_private(path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        with open(path, "rb") as f:
            pem = f.read(MAX_KEY_BYTES + 1)
    except OSError as err:
        raise KeyProblem(f"signing key {path.name}: cannot read ({err.strerror or err})") from None
    return _loaded_key(lambda: serialization.load_pem_private_key(pem, password=None), Ed25519PrivateKey,
                       f"signing key {path.name}", "an unencrypted PEM private key", "ed25519",
                       "make one with contracts keys generate PATH")


def generate(path: Path) -> str:
    """Write a new ed25519 private key to `path` (mode 0600, never over an existing file) and its public key to
    `path`.pub; return the key id."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if p.exists() or p.is_symlink():
            raise KeyProblem(f"{p.name} already exists; keys are never overwritten: choose another PATH")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # O_EXCL: never follow or replace something created meanwhile; 0600 from the first byte, not chmod after
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(public)
    return key_id(key.public_key())


def envelope(statement_bytes: bytes, private_key) -> dict:
    """The DSSE envelope of the Statement bytes, signed with `private_key`."""
    sig = private_key.sign(pae(PAYLOAD_TYPE, statement_bytes))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(statement_bytes).decode("ascii"),
            "signatures": [{"keyid": key_id(private_key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}]}


def envelope_bytes(env: dict) -> bytes:
    """The exact bytes of a signed receipt file."""
    return (json.dumps(env, indent=1, sort_keys=True) + "\n").encode("ascii")


def is_envelope(data) -> bool:
    """True for a parsed JSON document shaped like a DSSE envelope (whatever its payload type)."""
    return isinstance(data, dict) and "payload" in data and "signatures" in data and "_type" not in data


def open_envelope(data: dict) -> tuple[bytes, list[dict]]:
    """(payload bytes, signatures) of a parsed envelope; ValueError with one line when it is malformed."""
    if set(data) != ENVELOPE_KEYS:
        extra = sorted(set(data) - ENVELOPE_KEYS)
        missing = sorted(ENVELOPE_KEYS - set(data))
        raise ValueError("not a DSSE envelope (" + ("; ".join(
            ([f"unexpected field(s) {', '.join(extra)}"] if extra else [])
            + ([f"missing {', '.join(missing)}"] if missing else []))) + ")")
    if data["payloadType"] != PAYLOAD_TYPE:
        raise ValueError(f"DSSE payloadType {str(data['payloadType'])[:80]!r} is not {PAYLOAD_TYPE}")
    if not isinstance(data["payload"], str):
        raise ValueError("DSSE payload is not a base64 string")
    try:
        payload = base64.b64decode(data["payload"].encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError("DSSE payload is not valid base64") from None
    sigs = data["signatures"]
    # Key ids are shown on terminals: printable ASCII only (ours are 64 hex digits), so none carries a control.
    if not isinstance(sigs, list) or not sigs or len(sigs) > 16 or not all(
            isinstance(s, dict) and set(s) == {"keyid", "sig"} and isinstance(s["keyid"], str)
            and isinstance(s["sig"], str) and _printable(s["keyid"], 256) and _printable(s["sig"], 1024) for s in sigs):
        raise ValueError("DSSE signatures is not a list of 1 to 16 {keyid, sig} entries of printable ASCII")
    return payload, sigs


def _printable(text: str, limit: int) -> bool:
    return 0 < len(text) <= limit and text.isascii() and text.isprintable()


def verify_signatures(payload: bytes, sigs: list[dict], keys: dict) -> tuple[str | None, str]:
    """(key id that verifies, "") or (None, why) against `keys` (key id -> Ed25519PublicKey).

    Why is `untrusted key` (no signature by a key in `keys`) or `bad signature` (a
    signature claims a known key id and does not verify).
    """
    from cryptography.exceptions import InvalidSignature

    message = pae(PAYLOAD_TYPE, payload)
    bad = False
    for s in sigs:
        key = keys.get(s["keyid"])
        if key is None:
            continue
        try:
            sig = base64.b64decode(s["sig"].encode("ascii"), validate=True)
            key.verify(sig, message)
        except (ValueError, UnicodeEncodeError, InvalidSignature):
            bad = True
            continue
        return s["keyid"], ""
    return None, "bad signature" if bad else "untrusted key"


# --- the signing process ---------------------------------------------------------


def _signer_command(key_path: Path) -> list[str]:
    """`python -I` (no PYTHON* variables, no user site, no current folder on the path) running `main` of this
    file's package with only its parent folder added, so nothing but this module and `cryptography` loads."""
    top = str(Path(__file__).resolve().parent.parent.parent)
    code = (f"import sys; sys.path.insert(0, {top!r}); from engine.store.signing import main; "
            "sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-I", "-c", code, "sign", str(Path(key_path).resolve())]


def sign_in_subprocess(statement_bytes: bytes, signer, timeout: float = 60.0) -> bytes:
    """The signed receipt bytes, made by a process of its own (see the module text).

    `signer` is a key path (this module's `sign KEY`, run as `_signer_command` says) or a command line
    (`--sign-command`: e.g. the same module run as another OS user, who alone can read the key). Either gets
    the Statement bytes on stdin and must print a DSSE envelope of exactly those bytes. KeyProblem with the
    signer's one-line reason when it fails.
    """
    if isinstance(signer, (str, os.PathLike)):
        cmd = _signer_command(Path(signer))
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "SYSTEMROOT")}
    else:
        cmd, env = list(signer), None
    try:
        done = subprocess.run(cmd, input=statement_bytes, capture_output=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError) as err:
        raise KeyProblem(f"the signing process did not run: {err}") from None
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise KeyProblem(why[-1] if why else f"the signing process exited {done.returncode}")
    try:
        env_doc = json.loads(done.stdout.decode("utf-8"))
        payload = open_envelope(env_doc)[0] if is_envelope(env_doc) else None
    except (UnicodeDecodeError, ValueError) as err:
        raise KeyProblem(f"the signing process printed no DSSE envelope ({str(err)[:120]})") from None
    if payload != statement_bytes:
        raise KeyProblem("the signing process printed no DSSE envelope of the receipt it was given")
    return envelope_bytes(env_doc)


SIGNING_KEY_ENV = "CONTRACTS_SIGNING_KEY"
SIGN_COMMAND_ENV = "CONTRACTS_SIGN_COMMAND"


def usable_signer(key: Path | None, command: str | None = None):
    """What signs receipts: --sign-key (else $CONTRACTS_SIGNING_KEY) as a resolved Path, --sign-command (else
    $CONTRACTS_SIGN_COMMAND) as a tuple of arguments, or None; proven to work first.

    The proof is a signature over nothing made by the signing process: the caller, which is about to run
    method code, never opens a key file itself. KeyProblem (one line) when it does not work or both are given.
    """
    import shlex

    key = key if key is not None else (Path(os.environ[SIGNING_KEY_ENV]) if os.environ.get(SIGNING_KEY_ENV) else None)
    command = command if command is not None else (os.environ.get(SIGN_COMMAND_ENV) or None)
    if key is not None and command is not None:
        raise KeyProblem("give a signing key or a signing command, not both")
    if command is not None:
        try:
            signer = tuple(shlex.split(command))
        except ValueError as err:
            raise KeyProblem(f"signing command: {err}") from None
        if not signer:
            raise KeyProblem("signing command is empty")
    elif key is not None:
        if not Path(key).is_file():
            raise KeyProblem(f"signing key {key}: no such file; make one with contracts keys generate PATH")
        signer = Path(key).resolve()
    else:
        return None
    sign_in_subprocess(b"", signer)
    return signer


def main(argv: list[str]) -> int:
    """`sign KEY`: Statement bytes on stdin, the envelope's bytes on stdout. Exit 2 on a bad key."""
    if len(argv) != 2 or argv[0] != "sign":
        sys.stderr.write("usage: python -m engine.store.signing sign KEY < statement.json > envelope.json\n")
        return 2
    payload = sys.stdin.buffer.read()
    try:
        key = _load_private(Path(argv[1]))
    except KeyProblem as err:
        sys.stderr.write(f"{err}\n")
        return 2
    sys.stdout.buffer.write(envelope_bytes(envelope(payload, key)))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
