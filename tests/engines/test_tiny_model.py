"""The tiny model vLLM serves in the engine tests: built from code, nothing downloaded.

Built here with the project's own transformers (the engine venv pins its own); what vLLM
needs of it holds for both: a head size CPU attention takes, the tokenizer beside the
weights, and a chat template for /v1/chat/completions."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model import EOS, SHAPE, VOCAB_SIZE, build_model, train_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-model")
    vocab = train_tokenizer(out)
    from transformers import AutoTokenizer

    build_model(out, vocab, AutoTokenizer.from_pretrained(out).eos_token_id)
    return out


def test_shape_is_what_cpu_attention_takes(model_dir: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    assert config.hidden_size // config.num_attention_heads >= 32
    assert config.num_hidden_layers == SHAPE["num_hidden_layers"]
    assert config.vocab_size == VOCAB_SIZE
    assert (model_dir / "model.safetensors").stat().st_size < 32 * 2**20


def test_tokenizer_round_trips_and_templates_chats(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "How far is the moon from here?"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2  # trained merges, not one token a byte
    assert tok.eos_token == EOS
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == f"user: {text}\nassistant:"
