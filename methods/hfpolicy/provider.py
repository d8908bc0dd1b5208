"""Load a checkpoint once; build seeded, LoRA-wrapped HFPolicy copies for the mechanism runs."""

from __future__ import annotations

import copy
import inspect
import warnings
from pathlib import Path

import torch

from engine.errors import EnvironmentProblem, UsageError
from engine.paths import project_root
from engine.store.receipts import subjects as file_subjects
from methods.hfpolicy import task
from methods.hfpolicy.checkpoint import CONFIG, Checkpoint
from methods.hfpolicy.policy import HFPolicy

LORA_TARGETS = "all-linear"  # peft: every linear layer but the output head
DTYPE = torch.float32  # the mechanism runs' declared dtype, whatever the checkpoint was saved in


def _require(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise EnvironmentProblem(f"--policy hf: needs {module}, which is not installed; install the [hf] extra: "
                                 "pip install -e '.[hf]'") from None


class HFPolicyProvider:
    """`build()` gives a fresh policy per call: the checkpoint's weights, LoRA (rank `lora_rank`,
    A seeded from the run seed, B = 0, so the start equals the checkpoint), on the run's device."""

    def __init__(self, checkpoint: Checkpoint, lora_rank: int = 8):
        if not isinstance(lora_rank, int) or lora_rank < 0:
            raise UsageError(f"--lora-rank {lora_rank!r}: give 0 (train every weight) or a positive rank, e.g. 8")
        transformers = _require("transformers")
        self.peft = _require("peft") if lora_rank else None
        self.checkpoint = checkpoint
        self.lora_rank = lora_rank
        folder = str(checkpoint.folder)
        transformers.utils.logging.disable_progress_bar()  # one "loading" line from us is enough
        try:
            # local_files_only: a checkpoint comes from disk, never from a hub.
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=DTYPE, local_files_only=True, trust_remote_code=False)
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, KeyError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UsageError(f"--policy hf:{checkpoint.name}: transformers could not load it: {first}") from None
        self.model.eval()
        params = inspect.signature(type(self.model).forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.prefix = task.prefix_ids(self.tokenizer)
        self.maps: dict[int, list[int]] = {}
        self.trainable: int | None = None
        self.transformers_version = transformers.__version__

    def token_ids(self, vocab_size: int) -> list[int]:
        if vocab_size not in self.maps:
            ids = task.token_ids(self.tokenizer, vocab_size)
            n = self.model.get_input_embeddings().num_embeddings
            if max(ids + self.prefix) >= n:
                raise UsageError(f"--policy hf:{self.checkpoint.name}: the tokenizer gives ids past the model's "
                                 f"{n} embeddings; the tokenizer and weights do not belong together")
            self.maps[vocab_size] = ids
        return self.maps[vocab_size]

    def build(self, seed: int, device, vocab_size: int, hidden_size: int | None = None) -> HFPolicy:
        """A fresh trainable policy; `hidden_size` is the tiny model's and does not apply."""
        ids = self.token_ids(vocab_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = copy.deepcopy(self.model)
            if self.lora_rank:
                cfg = self.peft.LoraConfig(r=self.lora_rank, lora_alpha=2 * self.lora_rank, lora_dropout=0.0,
                                           target_modules=LORA_TARGETS, bias="none")
                with warnings.catch_warnings():  # peft calls a transformers API that v5 deprecates
                    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                    model = self.peft.get_peft_model(model, cfg)
        model.eval()  # no dropout: the first proximal update must see the behaviour policy exactly
        if self.trainable is None:
            self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return HFPolicy(model, ids, self.prefix, self.cache_arg).to(device)

    def subjects(self) -> list[dict]:
        """This package's code and the checkpoint's config, weight and tokenizer files."""
        root = project_root()
        here = Path(__file__).resolve().parent
        code = sorted(p.relative_to(root).as_posix() for p in here.rglob("*.py"))
        return file_subjects(root, code) + self.checkpoint.subjects()

    def describe(self) -> dict:
        cfg = self.checkpoint.config()
        decode = self.tokenizer.convert_ids_to_tokens
        longest = max(self.maps.values(), key=len, default=[])
        return {
            "kind": "hf",
            "checkpoint": {
                "name": self.checkpoint.name,
                "model_type": cfg.get("model_type"),
                "architectures": cfg.get("architectures"),
                "config_sha256": self.checkpoint.digest(CONFIG),
                "weight_files": {f: self.checkpoint.digest(f) for f in self.checkpoint.weight_files()},
                "parameters": sum(p.numel() for p in self.model.parameters()),
            },
            "dtype": str(DTYPE).removeprefix("torch."),
            "lora": None if not self.lora_rank else {
                "rank": self.lora_rank, "alpha": 2 * self.lora_rank, "dropout": 0.0, "target_modules": LORA_TARGETS},
            "trainable_parameters": self.trainable,
            # Task token t is token_ids[t] whatever a mechanism's task vocabulary size (the maps are prefixes
            # of one another), so the longest one built says it for every run of this provider.
            "task": {"prefix": task.PROMPT_PREFIX, "prefix_ids": list(self.prefix),
                     "token_ids": longest, "tokens": decode(longest)},
            "libraries": {"transformers": self.transformers_version,
                          "peft": None if self.peft is None else self.peft.__version__},
        }
