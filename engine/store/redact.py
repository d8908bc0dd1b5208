"""Receipts say what ran, never where or by whom.

The engine writes no absolute path, host name, user name or environment
variable into a receipt on purpose; text it does not control can still carry
them: an exception's message (`FileNotFoundError: ... '/home/alice/x'`), a
note a check recorded, a provider's description. `scrub_predicate` runs on
every predicate before its id is computed (engine.store.receipts.statement):

* everywhere: an absolute path under the project becomes repository-relative;
  any other absolute path becomes `<abs>/<file name>` (ids and names cannot
  hold a `/`, so this never touches an identifier);
* everywhere: token-like secrets (GitHub, Hugging Face, OpenAI-style, AWS,
  Slack tokens, JWTs, private key blocks, `password=...`-style assignments,
  credentials in URLs) become `<secret>`;
* in free text (messages, errors, notes, reasons, and everything a mechanism
  run recorded: its step records and comparisons): also the values of
  environment variables (8 characters or more) and the user and host names
  where they stand as words or in `user@host` / `//host` forms.

Dict keys are scrubbed by the same rules as the values beside them: a check
controls the keys of what it records as much as the values.

Top-level fields the engine fills from known sources (versions, digests,
ids, the spec's own fields) are left exactly as they are.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from pathlib import Path
from typing import Any

STRUCTURED = frozenset({"schema", "created_at", "finished_at", "git", "method", "spec", "environment", "budget",
                        "receipt_id", "subject_sha256", "status"})
FREE_TEXT = frozenset({"message", "messages", "error", "errors", "note", "notes", "reason", "reasons", "detail",
                       "log", "warning", "warnings",
                       "mechanism"})  # step records and comparisons: whatever a check chose to write down
MIN_ENV_VALUE = 8  # shorter values ("1", "cpu", "C.UTF-8") are not identifying and would match everywhere
# An absolute path: a "/" that does not continue a word, then at least two segments.
_ABS = re.compile(r"(?<![\w.~<>-])/(?:[^\s/'\"`()\[\]{},;:<>|*?]+/)+[^\s/'\"`()\[\]{},;:<>|*?]*")


# Token-like secrets, by their published shapes; an assignment keeps its name and loses its value.
_SECRETS = re.compile(
    r"\bgh[pousr]_[A-Za-z0-9]{20,}"  # GitHub tokens
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bhf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|\bsk-[A-Za-z0-9_-]{20,}"  # OpenAI-style API keys
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key ids
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWTs
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
    re.S)
_ASSIGNED = re.compile(
    r"(?i)\b((?:[a-z0-9]+[_-])*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|auth)"
    r"(?:[_-][a-z0-9]+)*[\"']?\s*[=:]\s*[\"']?)([^\s\"',;]{4,})")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@:]+:[^\s/@]+@")


def scrub_secrets(text: str) -> str:
    """Token-like secrets in `text` replaced by `<secret>` (see the module docstring)."""
    text = _SECRETS.sub("<secret>", text)
    text = _ASSIGNED.sub(lambda m: m.group(1) + "<secret>", text)
    return _URL_CREDENTIALS.sub(lambda m: m.group(1) + "<secret>@", text)


def _word(text: str) -> re.Pattern:
    return re.compile(r"(?<![\w.-])" + re.escape(text) + r"(?![\w-])")


class Scrubber:
    """The facts of this process (project root, user, host, environment) to scrub, gathered once."""

    def __init__(self, root: Path | None = None, environ: dict | None = None):
        from engine.paths import project_root

        self.root = str((root or project_root()).resolve())
        home = str(Path.home())
        self.home_re = re.compile(r"(?<![\w.~<>-])" + re.escape(home) + r"(?![\w.-])") if len(home) > 1 else None
        env = dict(os.environ if environ is None else environ)
        self.env = sorted(((v, k) for k, v in env.items() if len(v) >= MIN_ENV_VALUE), key=lambda p: -len(p[0]))
        names = []
        for get in (getpass.getuser, socket.gethostname):
            try:
                names.append(get())
            except Exception:  # no user database entry, no host name: nothing to scrub
                names.append("")
        self.user, self.host = names
        self.user_re = _word(self.user) if len(self.user) >= 2 else None
        self.host_re = _word(self.host) if len(self.host) >= 2 else None

    def path(self, text: str) -> str:
        """Absolute paths (and token-like secrets) scrubbed: safe for any field, identifiers included."""
        text = scrub_secrets(text)

        def one(m: re.Match) -> str:
            p = m.group(0)
            if p == self.root or p.startswith(self.root + "/"):
                return p[len(self.root) + 1:] or "."
            name = p.rstrip("/").rsplit("/", 1)[-1]
            return f"<abs>/{name}" if name else "<abs>"

        text = _ABS.sub(one, text)
        return self.home_re.sub("~", text) if self.home_re is not None else text  # a bare "/home/alice"

    def key(self, text: str) -> str:
        """A dict key outside free text (a measurement's or a contract's name): paths, secrets, environment
        values and `user@host` scrubbed; a bare word equal to the user or host name is left, since an id
        such as `root` must stay the id it is."""
        text = self.path(text)
        for value, key in self.env:
            if value in text:
                text = text.replace(value, f"<env:{key}>")
        if self.user and self.host:
            text = text.replace(f"{self.user}@{self.host}", "<user>@<host>")
        if self.host_re is not None:
            text = text.replace(f"//{self.host}", "//<host>")
        return text

    def free(self, text: str) -> str:
        text = self.path(text)  # first, so a path under the project stays a useful relative one
        for value, key in self.env:
            if value in text:
                text = text.replace(value, f"<env:{key}>")
        if self.user_re is not None:
            text = self.user_re.sub("<user>", text)
        if self.host_re is not None:
            text = self.host_re.sub("<host>", text)
        return text


def _walk(value: Any, s: Scrubber, free: bool) -> Any:
    if isinstance(value, str):
        return s.free(value) if free else s.path(value)
    if isinstance(value, dict):
        out: dict = {}
        for k, v in value.items():
            key = (s.free(k) if free else s.key(k)) if isinstance(k, str) else k
            while key in out:  # two keys that scrub alike both stay
                key = f"{key}~"
            out[key] = _walk(v, s, free or k in FREE_TEXT)
        return out
    if isinstance(value, list):
        return [_walk(v, s, free) for v in value]
    return value


def scrub_predicate(predicate: dict, scrubber: Scrubber | None = None) -> dict:
    """The predicate with free text scrubbed of paths, user, host and environment values (a new dict)."""
    s = scrubber or Scrubber()
    return {k: (v if k in STRUCTURED else _walk(v, s, k in FREE_TEXT)) for k, v in predicate.items()}
