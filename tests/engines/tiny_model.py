"""Writes a random-weight Llama and its byte-level BPE tokenizer into a folder vLLM can serve.

Run with the engine venv's interpreter (`.venv-engines/bin/python tiny_model.py OUT`):
transformers and tokenizers are the versions vLLM reads.  Nothing is downloaded; the
weights are seeded, so two builds are the same model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "examples" / "data" / "corpus"
EOS = "<|endoftext|>"

# CPU attention needs a head size of at least 32; the rest is as small as gives a prefill
# of a long prompt that is visibly longer than a decode step (the stutter scenario).
SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
}
VOCAB_SIZE = 1024


def train_tokenizer(out: Path) -> int:
    """Trains the BPE on the shipped corpus, saves it for transformers; gives the vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.txt"))]
    bpe.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=EOS)
    # a chat template, so /v1/chat/completions works: the messages' text, one per line
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(out)
    return int(bpe.get_vocab_size())


def build_model(out: Path, vocab_size: int, eos_id: int) -> int:
    """Saves the seeded random Llama; gives its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(22)
    config = LlamaConfig(
        vocab_size=vocab_size,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=True,
        **SHAPE,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(out)
    from transformers import AutoTokenizer

    eos_id = AutoTokenizer.from_pretrained(out).eos_token_id
    params = build_model(out, vocab, eos_id)
    print(json.dumps({"dir": str(out), "vocab_size": vocab, "parameters": params}))


if __name__ == "__main__":
    main()
