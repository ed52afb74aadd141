"""Prepare the hf_causal_lm example's data: a locally trained tokenizer and token arrays, no downloads.

The text is the Python standard library's source, split exactly as crosscloud's
engine splits it (``crosscloud.training.corpus.build_corpus``). A byte-level BPE
tokenizer is trained on the training shards only, then every shard becomes a
1-D ``.npy`` token array::

    DIR/tokenizer.json
    DIR/train/shard-000.npy ...   one per --shards
    DIR/val/val-000.npy           the held-out text

The same arguments give byte-identical files, so content-addressed storage
finds them already uploaded on a second run.

    python examples/hf_causal_lm/prepare.py --out DIR [--vocab-size 4096] [--shards 12] [--seed 0] [--max-bytes 4000000]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import numpy as np
from crosscloud.training.corpus import build_corpus
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"  # id 0: train.py's bos/eos/pad id


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 style: any byte sequence encodes, no unknown token) trained on ``texts``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def _save_atomic(path: Path, write) -> None:
    """Write through a temporary file and rename, so a crash never leaves a half-written file under its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    tmp.replace(path)


def _save_tokens(path: Path, ids: list[int], dtype: type) -> int:
    """Save one token array; returns its length."""
    array = np.asarray(ids, dtype=dtype)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.save would append .npy to a bare path
            np.save(f, array, allow_pickle=False)

    _save_atomic(path, write)
    return int(array.size)


def prepare(out: Path, vocab_size: int, shards: int, seed: int, max_bytes: int) -> dict:
    """Build the corpus, train the tokenizer, write every file; returns the token counts."""
    train_bytes, held_out = build_corpus(shards, seed, max_bytes)
    # The standard library is UTF-8; "replace" only guards against a stray byte.
    train_texts = [b.decode("utf-8", errors="replace") for b in train_bytes]
    val_text = held_out.decode("utf-8", errors="replace")
    tokenizer = train_tokenizer(train_texts, vocab_size)
    _save_atomic(out / "tokenizer.json", lambda tmp: tokenizer.save(str(tmp), pretty=False))
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.uint32
    encoded = tokenizer.encode_batch(train_texts + [val_text], add_special_tokens=False)
    train_dir = out / "train"
    names = [f"shard-{i:03d}.npy" for i in range(shards)]
    counts = {"train": 0, "val": 0}
    for name, enc in zip(names, encoded[:-1]):
        counts["train"] += _save_tokens(train_dir / name, enc.ids, dtype)
    for stale in {p.name for p in train_dir.glob("shard-*.npy")} - set(names):
        (train_dir / stale).unlink()  # left by an earlier run with more shards: would be read as data
    counts["val"] = _save_tokens(out / "val" / "val-000.npy", encoded[-1].ids, dtype)
    counts["vocab"] = tokenizer.get_vocab_size()
    return counts


def main(argv: list[str] | None = None) -> None:
    """The command line: one summary line, so a script can log what it prepared."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json, train/ and val/")
    parser.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary (train.py's vocab_size arg)")
    parser.add_argument("--shards", type=int, default=12, help="training shards (files) to write")
    parser.add_argument("--seed", type=int, default=0, help="which standard-library files, in which order")
    parser.add_argument("--max-bytes", type=int, default=4_000_000, help="corpus size in bytes, about")
    args = parser.parse_args(argv)
    counts = prepare(args.out, args.vocab_size, args.shards, args.seed, args.max_bytes)
    print(f"prepared {args.out}: train {counts['train']} tokens in {args.shards} shards, "
          f"val {counts['val']} tokens, vocab {counts['vocab']}")


if __name__ == "__main__":
    main()
