"""A tiny random-initialised Qwen2-style checkpoint, built offline from a config (no download).

A byte-level BPE tokenizer (Qwen2's kind) trained in memory on the task's words
and instruction, and a two-layer Qwen2ForCausalLM with hidden size 32, saved
with save_pretrained exactly as a real checkpoint folder is laid out.
"""

from __future__ import annotations

from pathlib import Path

from methods.hfpolicy.task import PROMPT_PREFIX, WORDS

EOT = "<|endoftext|>"


def build_tiny_qwen2(folder: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    corpus = ["".join(WORDS)] * 20 + [PROMPT_PREFIX] * 20
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1, special_tokens=[EOT], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOT, pad_token=EOT)
    tok.save_pretrained(folder)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(folder)
    return folder


def tiny_checkpoint(tmp_path_factory) -> Path:
    """The tiny checkpoint in a fresh temporary folder, or a skip where the [hf] extra is not installed."""
    import pytest

    for module in ("transformers", "peft", "tokenizers"):
        pytest.importorskip(module)
    return build_tiny_qwen2(tmp_path_factory.mktemp("ckpt") / "tiny-qwen2")
