"""A hashed n-gram byte model: a very large embedding table and a small head, cheap to compute at any size.

Each position's last ``order`` bytes are hashed into one row of an embedding
table of ``rows`` x ``dim`` (sparse gradients: a step touches only its rows),
and a linear head over that row predicts the next byte. Its parameter count is
set by ``rows`` alone, so ``make bench-control-plane`` trains a model of a
billion parameters or more whose steps cost little; plain SGD keeps no state
beside the weights. It reads a files dataset of raw bytes as memory maps.
"""

import zlib

import numpy as np
import torch
import torch.nn.functional as F

import crosscloud.sdk as cc

FAMILY = "byte-lm"  # plain PyTorch: it runs wherever the byte-LM image does
EVAL_BATCHES = 4
POSITIONS = 256  # positions of one sample
PRIME = 1_000_003


def model_name(args):
    return f"hashed-ngram-{int(args['rows'])}x{int(args.get('dim', 8))}"


def figures(args):
    """Unknown until measured: nothing declared (crosscloud estimates from the parameter count)."""
    return None


class HashedNgram(torch.nn.Module):
    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.table = torch.nn.Embedding(rows, dim, sparse=True)
        self.head = torch.nn.Linear(dim, 256)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(rows))


def build_model(args):
    torch.manual_seed(args["seed"])
    model = HashedNgram(int(args["rows"]), int(args.get("dim", 8)))
    if model.table.weight.device.type != "meta":
        torch.nn.init.normal_(model.table.weight, std=0.02)
    return model


def _rows(data: np.ndarray, starts: np.ndarray, order: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The table row of every position's last ``order`` bytes, and the byte that follows each."""
    idx = starts[:, None] + np.arange(POSITIONS)[None, :] + order
    h = np.zeros(idx.shape, dtype=np.int64)
    for k in range(1, order + 1):
        h = (h * PRIME + data[idx - k].astype(np.int64)) % rows
    return torch.from_numpy(h), torch.from_numpy(data[idx].astype(np.int64))


def _loss(model, data, starts, order, rows):
    x, y = _rows(data, starts, order, rows)
    return F.cross_entropy(model(x.to(next(model.parameters()).device)).reshape(-1, 256), y.reshape(-1).to(x.device))


def _maps(files):
    return [np.memmap(f, dtype=np.uint8, mode="r") for f in files]


def evaluate(model, run):
    order, rows = int(run.args.get("order", 3)), int(run.args["rows"])
    data = _maps(run.eval_files())[0]
    rng = np.random.default_rng(0)
    losses = [_loss(model, data, rng.integers(0, len(data) - POSITIONS - order - 1, 16), order, rows).item()
              for _ in range(run.eval_batches or EVAL_BATCHES)]
    return float(np.mean(losses))


if __name__ == "__main__":
    run = cc.init()
    order, rows = int(run.args.get("order", 3)), int(run.args["rows"])
    model = build_model(run.args).to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=run.args["lr"])
    step = run.resume(model, opt)
    maps = _maps(run.data_files())
    rng = np.random.default_rng(zlib.crc32(f"{run.cloud}/{run.rank}/{step}".encode()))
    with cc.DiLoCo(run, model, opt) as diloco:
        while not diloco.done:
            data = maps[rng.integers(len(maps))]
            starts = rng.integers(0, len(data) - POSITIONS - order - 1, run.batch_size)
            loss = _loss(model, data, starts, order, rows)
            loss.backward()
            opt.step()
            opt.zero_grad()
            diloco.step(loss=loss)
            step += 1
