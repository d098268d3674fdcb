"""A small byte-level BPE tokenizer trained offline on the Spec-Bench prompts, saved in HF format."""

from __future__ import annotations

import json
from pathlib import Path

from backend.config import REPO_ROOT

SPEC_BENCH = REPO_ROOT / "datasets" / "spec_bench" / "question.jsonl"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]


def corpus_texts(extra: list[str] | None = None) -> list[str]:
    texts = []
    for line in SPEC_BENCH.read_text().splitlines():
        row = json.loads(line)
        texts.extend(t for t in row.get("turns", []) if isinstance(t, str))
        ref = row.get("reference")
        if isinstance(ref, list):
            texts.extend(r for r in ref if isinstance(r, str))
    return texts + list(extra or [])


def build_tokenizer(out: Path, vocab_size: int = 4096, texts: list[str] | None = None):
    """Train, save to `out` (tokenizer.json + config), and return a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts or corpus_texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>", unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast
