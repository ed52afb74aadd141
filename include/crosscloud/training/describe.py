"""What a program is, said by a short child process: admission never imports a program or torch itself.

``python -m crosscloud.training.describe --program P --args JSON`` imports the
program, builds its model on the meta device (``training.layout``) and prints
one JSON object: its family, dataset, model name, the model's tensors and
what it declares it costs; or ``{"error": ...}`` with the program's own error
(not found, failed to import, no ``FAMILY``...). The process that admits a run
(an Airflow task) reads that and stays as small as its own code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from crosscloud.core.job import DEFAULT_DATASET
from crosscloud.training.program import ProgramError, load_program, program_family, program_model_name


def describe(path: Path, label: str, args: dict) -> dict:
    from crosscloud.training.layout import model_layout

    module = load_program(path, label)
    family = program_family(module, label)
    declared = module.figures(args) if callable(getattr(module, "figures", None)) else getattr(module, "FIGURES", None)
    return {"family": family, "dataset": getattr(module, "DATASET", DEFAULT_DATASET),
            "model_name": program_model_name(module, path, family, args, label),
            "tensors": model_layout(module, args), "declared": declared}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m crosscloud.training.describe")
    p.add_argument("--path", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--args", required=True, help="the program's run.args as JSON")
    opts = p.parse_args(argv)
    try:
        out = describe(Path(opts.path), opts.label, json.loads(opts.args))
    except ProgramError as exc:
        out = {"error": str(exc)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
