"""The join check's sub-task: proves, on the cloud itself, that its store and its environment work.

It reads the probe object the check put in the cloud's store, trains one step
of the smallest model with the cloud's torch, and writes its answer back. Run
as ``python -m crosscloud.training.join_probe --tenant T --cloud C --key K``.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from crosscloud.core.federation import load_federation
from crosscloud.core.presets import preset
from crosscloud.store.open_store import open_store
from crosscloud.training.model import build_model, lm_loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crosscloud.training.join_probe")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--cloud", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--federation")
    args = parser.parse_args(argv)
    store = open_store(load_federation(args.federation).cloud(args.cloud), args.tenant)
    challenge = json.loads(store.get(f"{args.key}/challenge.json"))
    model = build_model(preset("tiny"), seed=0)
    loss = lm_loss(model, torch.randint(0, 256, (2, preset("tiny").seq_len + 1)))
    loss.backward()
    answer = {"nonce": challenge["nonce"], "torch": torch.__version__, "loss": float(loss), "python": sys.version.split()[0]}
    store.put(f"{args.key}/answer.json", json.dumps(answer).encode())
    print(f"probe on {args.cloud}: store and torch {torch.__version__} work (loss {float(loss):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
