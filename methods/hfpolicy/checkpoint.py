"""A local Hugging Face checkpoint folder: found on disk only, its files bound by digest.

Never a download: a name that looks like a Hub id gives an error saying what to
download and where. The files a load reads (config, weights, tokenizer) become
receipt subjects `checkpoint:<file>`, so a receipt names the exact weights.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import UsageError
from engine.store.receipts import EXTERNAL_SUBJECT_PREFIX, sha256_file

CONFIG = "config.json"
WEIGHTS = ("*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")
OTHERS = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
          "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "chat_template.jinja",
          "chat_template.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class Checkpoint:
    folder: Path
    files: tuple[str, ...]  # names inside `folder` that a load reads
    _digests: dict = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.folder.name

    def digest(self, name: str) -> str:
        """sha256 of one bound file (weights are large: hashed once)."""
        if name not in self._digests:
            self._digests[name] = sha256_file(self.folder / name)
        return self._digests[name]

    def subjects(self) -> list[dict]:
        return [{"name": f"{EXTERNAL_SUBJECT_PREFIX}{f}", "digest": {"sha256": self.digest(f)}} for f in self.files]

    def config(self) -> dict:
        return json.loads((self.folder / CONFIG).read_text(encoding="utf-8"))

    def weight_files(self) -> list[str]:
        return [f for f in self.files if any(fnmatch.fnmatch(f, p) for p in WEIGHTS)]


def find_checkpoint(location: str) -> Checkpoint:
    """The checkpoint folder at `location`, or a one-line UsageError saying what is wrong and how to fix it."""
    folder = Path(location).expanduser()
    if not folder.exists():
        if _HUB_ID.match(location):
            local = f"checkpoints/{location.split('/')[-1]}"
            raise UsageError(
                f"--policy hf:{location}: no local folder {location!r}; contracts loads checkpoints from disk only "
                f"and never downloads (budget downloads: false). If that is a Hugging Face Hub id, download it "
                f"first, e.g. `huggingface-cli download {location} --local-dir {local}`, then pass "
                f"--policy hf:{local}")
        raise UsageError(f"--policy hf:{location}: no such folder; give the local folder a model was saved to "
                         "with save_pretrained (it holds config.json and *.safetensors)")
    if not folder.is_dir():
        raise UsageError(f"--policy hf:{location} is a file; give the checkpoint's folder (config.json, *.safetensors)")
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    if CONFIG not in names:
        raise UsageError(f"--policy hf:{location}: no {CONFIG} in that folder, so it is not a Hugging Face "
                         "checkpoint; point at the folder save_pretrained wrote")
    try:
        json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"--policy hf:{location}: {CONFIG} is not readable JSON ({err})") from None
    bound = [n for n in names if n == CONFIG or any(fnmatch.fnmatch(n, p) for p in WEIGHTS + OTHERS)]
    ckpt = Checkpoint(folder=folder, files=tuple(bound))
    if not ckpt.weight_files():
        raise UsageError(f"--policy hf:{location}: no weight files (*.safetensors or pytorch_model*.bin) in that "
                         "folder; save the model with save_pretrained or download its weights")
    return ckpt
