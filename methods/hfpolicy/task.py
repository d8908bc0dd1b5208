"""The built-in verifiable task in a checkpoint's own tokens.

The mechanism runs' tasks (methods/common/tasks.py and the methods' own) speak
small task vocabularies: PAD = 0, EOS = 1, content tokens from 2. On a
checkpoint every task token is one real token of its tokenizer: PAD and EOS are
the tokenizer's, content tokens are the common English words below that the
tokenizer encodes as a single token, in this order. Every prompt is preceded by
PROMPT_PREFIX, tokenised the tokenizer's way (with its BOS, if it adds one).
The verifiers are unchanged: `TargetTokenTask` rewards a response that
contains the prompt's last word.
"""

from __future__ import annotations

from engine.errors import UsageError
from methods.common.tasks import EOS, FIRST_CONTENT, PAD

PROMPT_PREFIX = "Answer with words from the list:"
WORDS = tuple(
    " " + w
    for w in (
        "red blue green black white brown cat dog fish bird horse cow tree leaf rose grass sun moon star rain "
        "snow wind fire water stone gold iron salt milk bread apple king queen ship road door book hand eye "
        "house river sea hill city"
    ).split()
)


def token_ids(tokenizer, vocab_size: int) -> list[int]:
    """Model token id of every task token 0..vocab_size-1 ([PAD, EOS, words...])."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise UsageError("the checkpoint's tokenizer has no EOS token; the task needs one to end a response")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    specials = {pad, eos}
    content: list[int] = []
    for word in WORDS:
        ids = tokenizer.encode(word, add_special_tokens=False)
        if len(ids) == 1 and ids[0] not in specials and ids[0] not in content:
            content.append(ids[0])
    need = vocab_size - FIRST_CONTENT
    if len(content) < need:
        raise UsageError(f"the checkpoint's tokenizer encodes only {len(content)} of the task's {len(WORDS)} words "
                         f"as one token each; this mechanism needs {need}")
    out = [0] * FIRST_CONTENT
    out[PAD], out[EOS] = pad, eos
    return out + content[:need]


def prefix_ids(tokenizer) -> list[int]:
    return list(tokenizer.encode(PROMPT_PREFIX, add_special_tokens=True))
