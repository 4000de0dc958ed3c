"""A small decoder-only transformer with a slot-based KV cache.

Weights are seeded random numbers built from code (nothing is downloaded), so
the text it writes is nonsense, but every token costs real matrix work: prefill
grows with the prompt, a decode step grows with the batch and the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the tiny transformer; the defaults run in a few ms per decode step on 2 CPU cores."""

    vocab_size: int
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    max_seq_len: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def pick_device(prefer: str | None = None) -> torch.device:
    """Return the device to run on: the explicit choice, else CUDA when present, else CPU."""
    if prefer:
        return torch.device(prefer)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class KVCache:
    """Preallocated keys and values, one slot per live sequence.

    A slot holds up to `max_seq_len` positions for every layer; a sequence owns
    one slot from admission until it finishes or is cancelled. Preallocation
    keeps the decode hot path free of allocations, like a paged cache with one
    big page per sequence.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        shape = (config.n_layers, num_slots, config.n_heads, config.max_seq_len, config.head_dim)
        self.config = config
        self.num_slots = num_slots
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        # Positions filled per slot; kept on the host so scheduling never syncs the device.
        self.lengths = [0] * num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """Return a free slot, emptied; raises RuntimeError when all are taken."""
        if not self._free:
            raise RuntimeError("KV cache has no free slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back; releasing a free slot twice is a no-op."""
        if slot in self._free:
            return
        self.lengths[slot] = 0
        self._free.append(slot)

    def usage(self) -> float:
        """Return the fraction of all cache positions holding a token (0..1)."""
        return sum(self.lengths) / (self.num_slots * self.config.max_seq_len)


class _Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.ln_attn = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_out = nn.Linear(d, d)
        self.ln_mlp = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, config.d_ff)
        self.mlp_out = nn.Linear(config.d_ff, d)

    def mlp(self, x: Tensor) -> Tensor:
        return self.mlp_out(F.gelu(self.mlp_in(self.ln_mlp(x))))


class TinyTransformer(nn.Module):
    """Pre-LayerNorm GPT-style decoder with learned positions.

    Three entry points share the same layers:
    - `forward_full`: no cache, all logits (the reference the cache is tested against);
    - `prefill`: one sequence's prompt (or a chunk of it) into its cache slot;
    - `decode`: one new token for each of several sequences at different lengths.
    """

    def __init__(self, config: ModelConfig, load_weights: bool = True) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        # Untied: with random weights a tied head mostly echoes the last input token.
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.weights_loaded = False
        if load_weights:
            self.load_weights()

    def load_weights(self) -> None:
        """Fill the parameters with the seeded weights (the 'load from disk' of this model)."""
        self._init_weights(self.config.seed)
        self.weights_loaded = True

    def _init_weights(self, seed: int) -> None:
        # Wide, seeded weights: logits get a real spread, so greedy choices are
        # stable against float rounding (chunked vs unchunked prefill agree).
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("bias"):
                    param.zero_()
                elif "ln_" in name:
                    param.fill_(1.0)
                elif "emb" in name:
                    param.copy_(torch.randn(param.shape, generator=gen))
                else:
                    fan_in = param.shape[1]
                    param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(fan_in))

    def _layers(self) -> list[_Block]:
        return cast("list[_Block]", list(self.blocks))

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        cfg = self.config
        return x.view(batch, length, cfg.n_heads, cfg.head_dim).transpose(1, 2)

    def _merge_heads(self, x: Tensor) -> Tensor:
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.config.d_model)

    def _logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(self.ln_final(hidden))

    def _embed(self, token_ids: Tensor, positions: Tensor) -> Tensor:
        if int(positions.max()) >= self.config.max_seq_len:
            raise ValueError(f"position beyond max_seq_len {self.config.max_seq_len}")
        return self.tok_emb(token_ids) + self.pos_emb(positions)

    def forward_full(self, token_ids: Tensor) -> Tensor:
        """Return logits [batch, length, vocab] for whole sequences, without a cache."""
        length = token_ids.shape[1]
        positions = torch.arange(length, device=token_ids.device)
        x = self._embed(token_ids, positions)
        for block in self._layers():
            q, k, v = (self._split_heads(t) for t in block.qkv(block.ln_attn(x)).chunk(3, dim=-1))
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + block.attn_out(self._merge_heads(ctx))
            x = x + block.mlp(x)
        return self._logits(x)

    def prefill(self, cache: KVCache, slot: int, token_ids: Tensor) -> Tensor:
        """Append a prompt chunk to `slot`'s cache; return the logits [vocab] after its last token.

        The chunk starts where the slot's cache ends, so a prompt may be fed in
        several chunks (chunked prefill) with the same result as one.
        """
        start = cache.lengths[slot]
        length = int(token_ids.shape[0])
        end = start + length
        if length == 0:
            raise ValueError("empty prefill chunk")
        if end > self.config.max_seq_len:
            raise ValueError(
                f"sequence of {end} tokens exceeds max_seq_len {self.config.max_seq_len}"
            )
        device = token_ids.device
        positions = torch.arange(start, end, device=device)
        x = self._embed(token_ids, positions).unsqueeze(0)
        # Query i sits at absolute position start+i and sees keys 0..start+i.
        mask = None
        if start > 0:
            key_pos = torch.arange(end, device=device)
            mask = key_pos.unsqueeze(0) <= positions.unsqueeze(1)
        for layer, block in enumerate(self._layers()):
            q, k, v = (self._split_heads(t) for t in block.qkv(block.ln_attn(x)).chunk(3, dim=-1))
            cache.keys[layer, slot, :, start:end] = k[0]
            cache.values[layer, slot, :, start:end] = v[0]
            keys = cache.keys[layer, slot, :, :end].unsqueeze(0)
            values = cache.values[layer, slot, :, :end].unsqueeze(0)
            if mask is None:
                ctx = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
            else:
                ctx = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + block.attn_out(self._merge_heads(ctx))
            x = x + block.mlp(x)
        cache.lengths[slot] = end
        # Only the last position's logits are needed: skip the LM head for the rest.
        return self._logits(x[0, -1])

    def decode(self, cache: KVCache, slots: list[int], token_ids: Tensor) -> Tensor:
        """Feed one token per sequence (continuous batching); return logits [batch, vocab].

        Sequences may sit at different lengths: each writes its key/value at its
        own position and attends only to its own filled positions.
        """
        if len(slots) != int(token_ids.shape[0]):
            raise ValueError("one token per slot is required")
        device = token_ids.device
        host_positions = [cache.lengths[s] for s in slots]
        span = max(host_positions) + 1
        if span > self.config.max_seq_len:
            raise ValueError(f"sequence exceeds max_seq_len {self.config.max_seq_len}")
        positions = torch.tensor(host_positions, device=device)
        slot_index = torch.tensor(slots, device=device)
        x = self._embed(token_ids, positions).unsqueeze(1)
        # [batch, 1, 1, span]: each row sees its own prefix and the token just written.
        mask = (torch.arange(span, device=device).unsqueeze(0) <= positions.unsqueeze(1))[
            :, None, None, :
        ]
        for layer, block in enumerate(self._layers()):
            q, k, v = (self._split_heads(t) for t in block.qkv(block.ln_attn(x)).chunk(3, dim=-1))
            layer_keys = cache.keys[layer]
            layer_values = cache.values[layer]
            layer_keys[slot_index, :, positions] = k[:, :, 0]
            layer_values[slot_index, :, positions] = v[:, :, 0]
            # Slice first, then gather: copies only the filled span, not max_seq_len.
            keys = layer_keys[:, :, :span].index_select(0, slot_index)
            values = layer_values[:, :, :span].index_select(0, slot_index)
            ctx = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + block.attn_out(self._merge_heads(ctx))
            x = x + block.mlp(x)
        for slot, pos in zip(slots, host_positions, strict=True):
            cache.lengths[slot] = pos + 1
        return self._logits(x[:, 0])


def build_model(
    config: ModelConfig, device: torch.device | str | None = None, load_weights: bool = True
) -> TinyTransformer:
    """Return the seeded model on `device` (CUDA when available), in eval mode.

    load_weights=False leaves the weights to `model.load_weights()` (lazy loading).
    """
    model = TinyTransformer(config, load_weights).to(pick_device(str(device) if device else None))
    model.eval()
    return model
