from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tokentrace.examples.tiny_llm.model import KVCache, ModelConfig, build_model  # noqa: E402

CONFIG = ModelConfig(
    vocab_size=300, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=128, seed=3
)
ATOL = 1e-4


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return build_model(CONFIG, "cpu")


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_kv_cache_decode_matches_full_forward(model) -> None:  # type: ignore[no-untyped-def]
    tokens = _tokens(40, seed=1)
    reference = model.forward_full(tokens.unsqueeze(0))[0]
    cache = KVCache(CONFIG, num_slots=2)
    slot = cache.allocate()
    last = model.prefill(cache, slot, tokens[:30])
    torch.testing.assert_close(last, reference[29], atol=ATOL, rtol=0)
    for pos in range(30, 40):
        logits = model.decode(cache, [slot], tokens[pos : pos + 1])
        torch.testing.assert_close(logits[0], reference[pos], atol=ATOL, rtol=0)
    assert cache.lengths[slot] == 40


@torch.inference_mode()
def test_chunked_prefill_matches_one_shot(model) -> None:  # type: ignore[no-untyped-def]
    tokens = _tokens(50, seed=2)
    reference = model.forward_full(tokens.unsqueeze(0))[0]
    cache = KVCache(CONFIG, num_slots=1)
    slot = cache.allocate()
    for start in range(0, 50, 16):
        logits = model.prefill(cache, slot, tokens[start : start + 16])
        torch.testing.assert_close(logits, reference[min(start + 16, 50) - 1], atol=ATOL, rtol=0)


@torch.inference_mode()
def test_batched_decode_of_different_lengths(model) -> None:  # type: ignore[no-untyped-def]
    lengths = [5, 23, 61]
    sequences = [_tokens(n + 3, seed=10 + n) for n in lengths]
    cache = KVCache(CONFIG, num_slots=4)
    slots = [cache.allocate() for _ in lengths]
    for slot, seq, n in zip(slots, sequences, lengths, strict=True):
        model.prefill(cache, slot, seq[:n])
    for step in range(3):
        batch = torch.stack([seq[n + step] for seq, n in zip(sequences, lengths, strict=True)])
        logits = model.decode(cache, slots, batch)
        for row, (seq, n) in enumerate(zip(sequences, lengths, strict=True)):
            reference = model.forward_full(seq[: n + step + 1].unsqueeze(0))[0, -1]
            torch.testing.assert_close(logits[row], reference, atol=ATOL, rtol=0)
    assert [cache.lengths[s] for s in slots] == [n + 3 for n in lengths]


def test_kv_cache_slots_and_usage() -> None:
    cache = KVCache(CONFIG, num_slots=2)
    a, b = cache.allocate(), cache.allocate()
    assert a != b and cache.free_slots == 0
    with pytest.raises(RuntimeError):
        cache.allocate()
    cache.lengths[a] = 64
    assert cache.usage() == pytest.approx(64 / (2 * CONFIG.max_seq_len))
    cache.release(a)
    cache.release(a)  # twice is harmless
    assert cache.free_slots == 1 and cache.usage() == 0.0


@torch.inference_mode()
def test_sequence_longer_than_context_is_refused(model) -> None:  # type: ignore[no-untyped-def]
    cache = KVCache(CONFIG, num_slots=1)
    slot = cache.allocate()
    with pytest.raises(ValueError):
        model.prefill(cache, slot, _tokens(CONFIG.max_seq_len + 1, seed=4))


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ModelConfig(vocab_size=100, d_model=65, n_heads=4)
