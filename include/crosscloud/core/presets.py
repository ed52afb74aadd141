"""Model sizes a job can ask for; light enough to import at DAG parse time."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    vocab: int = 256
    family: str = "byte-lm"

    def to_dict(self) -> dict:
        return asdict(self)

    def parameters(self) -> int:
        """Parameters of ``model.ByteLM`` built from this config, without importing torch."""
        d = self.d_model
        block = 12 * d * d + 13 * d  # attention 4d^2 + 4d, MLP 8d^2 + 5d, two LayerNorms 4d
        return self.n_layers * block + 2 * self.vocab * d + self.seq_len * d + 2 * d

    def min_train_memory_gb(self) -> float:
        """Memory one device needs to train this model at all, so placement can refuse a pool that is too small.

        A lower bound: fp32 weights, gradients and AdamW's two moments (16 bytes
        a parameter) and the activations of a single sequence (per layer and
        token about 16 d floats and two attention rows per head, and the logits).
        """
        s, d = self.seq_len, self.d_model
        activations = 4 * (self.n_layers * s * (16 * d + 2 * self.n_heads * s) + 2 * s * self.vocab)
        return (16 * self.parameters() + activations) / 1e9


PRESETS = {
    "tiny": ModelConfig(d_model=64, n_layers=2, n_heads=4, seq_len=64),
    "small": ModelConfig(d_model=128, n_layers=2, n_heads=4, seq_len=128),
    "base": ModelConfig(d_model=256, n_layers=4, n_heads=8, seq_len=128),
    "large": ModelConfig(d_model=512, n_layers=6, n_heads=8, seq_len=128),
}

# Seconds one training sequence (forward, backward, AdamW) takes on one device of
# relative throughput 1.0: measured on one core of the 2-core reference machine.
# Placement turns them into a job's estimated run time; federation throughputs
# scale them per pool.
SAMPLE_SECONDS = {"tiny": 0.0013, "small": 0.006, "base": 0.036, "large": 0.19}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; choose one of {sorted(PRESETS)}") from None
