"""A small byte-level causal transformer language model, sized by a preset."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from crosscloud.core.presets import ModelConfig


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.register_buffer(
            "mask", torch.triu(torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool), 1), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        return lm_loss(self, batch)


def lm_loss(net: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-byte cross entropy; ``net`` may be the model or its DistributedDataParallel wrapper."""
    logits = net(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def build_model(cfg: ModelConfig, seed: int) -> ByteLM:
    torch.manual_seed(seed)
    return ByteLM(cfg)


def batches(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``batch`` random windows of ``seq_len + 1`` bytes from a uint8 tensor."""
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=generator)
    return torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()]).long()


@torch.no_grad()
def evaluate(model: ByteLM, held_out: torch.Tensor, n_batches: int = 8, batch: int = 16) -> float:
    """Mean loss on fixed held-out windows, the same for every call."""
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    losses = [model.loss(batches(held_out, batch, model.cfg.seq_len, gen)).item() for _ in range(n_batches)]
    model.train()
    return sum(losses) / len(losses)
