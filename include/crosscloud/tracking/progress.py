"""A live progress line for long commands: each cloud's rounds while a run trains.

Fed the log lines of a run (an Airflow task log, ``airflow dags test``'s
output, or the ``log`` callback of ``pipeline.stages.run_job``), it keeps one status
line - the global round, each cloud's committed rounds as a small bar, the
last eval loss - and prints the stage lines a person wants to see above it.
On a terminal the status line is redrawn in place; elsewhere (a CI log, a
pipe) it is printed only when it changes, so the output stays readable.
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

CLOUD_ROUND = re.compile(r"\[([a-z0-9-]+)\] round (\d+):")
# the watcher's (eval loss only in the rounds it evaluates); a cloud's line matches CLOUD_ROUND first
GLOBAL_ROUND = re.compile(r"\bround (\d+): (?:eval loss ([0-9.]+), )?wall ")
CALIBRATION = re.compile(r"calibrating (\d+) single-cluster rounds")
STAGE = re.compile(r"\[DAG TEST\] end task|placement [a-z]|cloud [a-z0-9-]+: share|preheat: |baseline: |eval loss [0-9.]+ -> ")
# what Airflow puts around a task's printed line
NOISE = (re.compile(r"^[0-9TZ:.+-]+ \[[a-z ]+\] +"), re.compile(r" +\[[A-Za-z0-9_.]+\] +loc=.*$"))
END_TASK = re.compile(r"^\[DAG TEST\] end task task_id=([a-z_]+) map_index=(-1|[0-9]+).*")


def clean(line: str) -> str:
    for pattern in NOISE:
        line = pattern.sub("", line)
    return END_TASK.sub(lambda m: f"stage done: {m[1]}" + ("" if m[2] == "-1" else f" [{m[2]}]"), line.rstrip())


class Progress:
    def __init__(self, rounds: int, out: TextIO = sys.stdout, live: bool | None = None, label: str = "training"):
        self.out = out
        self.live = out.isatty() if live is None else live
        self._start(rounds, label)
        self._shown = ""

    def _start(self, rounds: int, label: str) -> None:
        self.rounds, self.label = rounds, label
        self.clouds: dict[str, int] = {}
        self.done = 0
        self.eval_loss: float | None = None

    def status(self) -> str:
        def bar(n: int) -> str:
            width = min(self.rounds, 10)
            full = round(width * n / self.rounds)
            return "#" * full + "." * (width - full)

        clouds = " | ".join(f"{c} {bar(n)} {n}/{self.rounds}" for c, n in sorted(self.clouds.items()))
        loss = "" if self.eval_loss is None else f" | eval loss {self.eval_loss:.4f}"
        return f"{self.label}: round {self.done}/{self.rounds}" + (f" | {clouds}" if clouds else "") + loss

    def feed(self, line: str) -> None:
        if m := CLOUD_ROUND.search(line):
            self.clouds[m[1]] = max(self.clouds.get(m[1], 0), int(m[2]) + 1)
        elif m := GLOBAL_ROUND.search(line):
            self.done = int(m[1]) + 1
            if m[2] is not None:  # a round whose global was evaluated
                self.eval_loss = float(m[2])
        elif STAGE.search(line):
            self._print(clean(line))
            if m := CALIBRATION.search(line):
                self._start(int(m[1]), "baseline")
            return
        else:
            return
        self._draw()

    def _print(self, text: str) -> None:
        if self.live and self._shown:
            self.out.write("\r\033[K")
            self._shown = ""
        self.out.write(text + "\n")
        self.out.flush()

    def _draw(self) -> None:
        line = self.status()
        if line == self._shown:
            return
        self.out.write(f"\r\033[K{line}" if self.live else f"{line}\n")
        self.out.flush()
        self._shown = line

    def close(self) -> None:
        if self.live and self._shown:
            self.out.write("\n")
            self.out.flush()
