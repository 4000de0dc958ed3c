"""Tokenizers for the tiny LLM, built at start-up from the corpus shipped in examples/data.

`BPETokenizer` trains a byte-level BPE with HuggingFace `tokenizers` (well under
a second on the shipped corpus); `ByteTokenizer` is the dependency-free fallback.
Both speak the same small protocol, so the server does not care which it got.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)

CORPUS_DIR = Path(__file__).resolve().parent.parent / "data" / "corpus"
DEFAULT_VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"


class TextTokenizer(Protocol):
    """What the server needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


def corpus_files(corpus_dir: Path = CORPUS_DIR) -> list[Path]:
    """Return the corpus text files in a stable order (training must be reproducible)."""
    files = sorted(corpus_dir.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no *.txt corpus files in {corpus_dir}")
    return files


def read_corpus(corpus_dir: Path = CORPUS_DIR) -> str:
    """Return the whole corpus as one string, files joined by blank lines."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in corpus_files(corpus_dir))


class BPETokenizer:
    """Byte-level BPE trained on the corpus at construction time."""

    def __init__(self, texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        eos_id = tokenizer.token_to_id(EOS_TOKEN)
        if eos_id is None:
            raise RuntimeError("BPE training lost the end-of-text token")
        self._tokenizer = tokenizer
        self._eos_id: int = eos_id

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size())

    @property
    def eos_id(self) -> int:
        return int(self._eos_id)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids)))


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0..255), plus an end-of-text id 256."""

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eos_id(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


def build_tokenizer(
    kind: str = "bpe", vocab_size: int = DEFAULT_VOCAB_SIZE, corpus_dir: Path = CORPUS_DIR
) -> TextTokenizer:
    """Return a trained BPE tokenizer, or the byte tokenizer for kind="byte" or without `tokenizers`."""
    if kind not in ("bpe", "byte"):
        raise ValueError(f"tokenizer kind must be 'bpe' or 'byte', got {kind!r}")
    if kind == "byte":
        return ByteTokenizer()
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        logger.warning("`tokenizers` is not installed; falling back to the byte tokenizer")
        return ByteTokenizer()
    paragraphs = [p for p in read_corpus(corpus_dir).split("\n\n") if p.strip()]
    return BPETokenizer(paragraphs, vocab_size=vocab_size)
