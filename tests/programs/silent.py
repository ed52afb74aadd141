"""A program that never calls the SDK: it trains on its own and commits nothing."""

import time

import torch

FAMILY = "byte-lm"


def build_model(args):
    return torch.nn.Linear(4, 4)


def evaluate(model, run):
    return 1.0


if __name__ == "__main__":
    time.sleep(3600)
