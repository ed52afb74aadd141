"""Global 0 of a run that starts from no given weights: its builder cloud builds it, the other clouds copy it.

A fresh run's program passes ``build_model(run.args)`` to ``cc.DiLoCo`` (the
SDK's contract), so the builder cloud's sub-task (the home cloud's, when the
home cloud trains) commits that model's parameters as global 0 in its own
store, checked against the architecture admission described on the meta
device. Every other cloud's rank 0 copies the commit into its own store, in
bounded memory, and its ranks load it from there as they would load given
weights. Nothing model-sized is built anywhere else: not in an Airflow task,
not in the admitting process.
"""

from __future__ import annotations

import time

import torch

from crosscloud.store.base import ObjectStore
from crosscloud.store.commit import copy_object, read_commit, write_step
from crosscloud.store.header import architecture, parameters as counted
from crosscloud.store.tensors import to_bytes
from crosscloud.training.checkpoint import PARAMS
from crosscloud.training.program import ProgramError
from crosscloud.training.rounds import wait_for_commit
from crosscloud.training.session import Run, parameters


def publish_global0(run: Run, model: torch.nn.Module, builder_store: ObjectStore) -> None:
    """Make global 0 committed in this cloud's store (rank 0): built here on the builder cloud, copied from
    ``builder_store`` elsewhere. A sub-task started again finds it committed and does nothing."""
    plan = run.plan
    if read_commit(run.store, plan.keys.global_step(0)) is not None:
        return
    if run.cloud == plan.builder:
        _build(run, model)
    else:
        _copy(run, builder_store)


def _build(run: Run, model: torch.nn.Module) -> None:
    plan = run.plan
    data = to_bytes({n: p.detach() for n, p in parameters(model).items()})
    expected = plan.program.architecture if plan.program else ""
    if expected and architecture(data) != expected:
        raise ProgramError(
            f"program {plan.program.name}: the model passed to cc.DiLoCo on cloud {run.cloud} is architecture "
            f"{architecture(data)} ({counted(data):,} parameters), and build_model(run.args) at admission was "
            f"{expected} ({plan.program.parameters:,} parameters): pass the model build_model(run.args) builds, deterministic "
            "in its args")
    write_step(run.store, plan.keys.global_step(0), {PARAMS: data},
               meta={"round": -1, "published_at": time.time(), "built_on": run.cloud})


def _copy(run: Run, source: ObjectStore) -> None:
    plan, step = run.plan, run.plan.keys.global_step(0)
    commit = wait_for_commit(source, step, plan.keys.stop, plan.spec.round_timeout_s)
    entry = copy_object(source, commit["objects"][PARAMS], run.store, f"{step}/{PARAMS}")
    write_step(run.store, step, {}, refs={PARAMS: entry}, meta=commit["meta"])
