"""What a training program sees of its sub-task: ``crosscloud.sdk.init()`` and the ``Run`` it returns.

A sub-task finds its run through its environment (``CROSSCLOUD_TENANT``,
``CROSSCLOUD_RUN_ID``, ``CROSSCLOUD_CLOUD``, ``CROSSCLOUD_FEDERATION``, and
torchrun's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``): the plan in its cloud's
store says the rest. Only the cloud's own store is read and written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from crosscloud.core.federation import load_federation
from crosscloud.pool.partition import apportion
from crosscloud.run.plan import Plan
from crosscloud.store.base import ObjectStore
from crosscloud.store.open_store import open_store
from crosscloud.training.devices import select_device
from crosscloud.training.program import ProgramError, local_file
from crosscloud.training.resume import CloudState, latest_state

ENV = ("CROSSCLOUD_TENANT", "CROSSCLOUD_RUN_ID", "CROSSCLOUD_CLOUD")
_current: Run | None = None


def rank_batch(share: int, rank: int, world: int) -> int:
    """Sequences a rank trains per step when its cloud trains ``share`` of the global batch."""
    return apportion(share, [1.0] * world)[rank] if share >= world else min(share, 1)


class Run:
    """One rank of one cloud's sub-task: its plan, device, data files and arguments.

    ``batch_size`` is this rank's part of the global batch for the running round: it
    changes when shares move between clouds, so a loader reads it for every batch.
    Evaluation gets a ``Run`` too (rank 0 of the cloud that evaluates), for ``device``,
    ``args`` and ``eval_files``.
    """

    def __init__(self, plan: Plan, cloud: str, store: ObjectStore, rank: int = 0, world_size: int = 1,
                 local_rank: int = 0, device: torch.device | None = None):
        self.plan, self.cloud, self.store = plan, cloud, store
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.device = device or torch.device("cpu")
        self.args = plan.spec.program_run_args()
        share = plan.cloud(cloud).share if any(c.name == cloud for c in plan.clouds) else 0
        self.batch_size = rank_batch(share, rank, world_size)
        self.state: CloudState | None = None  # what resume found, for DiLoCo to go on from
        self.resumed = False
        self.eval_batches: int | None = None  # the program's EVAL_BATCHES: how much of the held-out set evaluate reads
        self.rounds_committed = 0

    @property
    def tenant(self) -> str:
        return self.plan.tenant

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    def data_files(self) -> list[Path]:
        """This rank's training shards as local files (a cloud's shards split over its ranks)."""
        me = self.plan.cloud(self.cloud)
        files = [local_file(self.store, self.tenant, self.plan.shards[i], self.plan.shard_name(i)) for i in me.shards]
        mine = files[self.rank::self.world_size]
        return mine or files  # fewer shards than ranks: every rank samples all of them

    def eval_files(self) -> list[Path]:
        """The dataset's held-out files, where this cloud holds them (the cloud that evaluates does)."""
        return [local_file(self.store, self.tenant, ref, self.plan.held_out_name(i))
                for i, ref in enumerate(self.plan.held_out)]

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load this cloud's last saved state into ``model`` and ``optimizer``; the inner steps already trained (0: none)."""
        self.resumed = True
        self.state = latest_state(self.store, self.plan.keys, self.cloud)
        if self.state is None:
            return 0
        load_params(model, self.state.params)
        optimizer.load_state_dict(_as_built(self.state.optimizer, optimizer))
        print(f"resuming after round {self.state.round} at step {self.state.steps}", flush=True)
        return self.state.steps


def _as_built(saved: dict, optimizer: torch.optim.Optimizer) -> dict:
    """A saved state_dict whose group settings were tuples where the optimizer has tuples (JSON keeps lists)."""
    groups = [{k: tuple(v) if isinstance(now.get(k), tuple) and isinstance(v, list) else v for k, v in group.items()}
              for group, now in zip(saved["param_groups"], optimizer.param_groups)]
    return {**saved, "param_groups": groups}


def parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The tensors rounds exchange: the model's parameters, each tied weight once."""
    return dict(unwrap(model).named_parameters())


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel (or similar) wrapper, whose names the globals use."""
    return getattr(model, "module", model)


@torch.no_grad()
def load_params(model: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Copy ``values`` into the model's parameters, on their device and in their dtype; names must match."""
    params = parameters(model)
    if set(params) != set(values):
        missing, extra = sorted(set(params) - set(values)), sorted(set(values) - set(params))
        raise ProgramError(f"the model's parameters do not match the global's: missing {missing[:5]}, extra {extra[:5]} "
                           "(does build_model(args) build the model the program trains?)")
    for name, p in params.items():
        p.copy_(values[name].to(device=p.device, dtype=p.dtype))


def _environment() -> dict[str, str]:
    missing = [k for k in ENV if not os.environ.get(k)]
    if missing:
        raise ProgramError(f"crosscloud.sdk.init(): {', '.join(missing)} not set; a program runs as a crosscloud "
                           "sub-task (crosscloud train PROGRAM, or the DAG cross_cloud_training), which sets them")
    return os.environ


def init() -> Run:
    """This sub-task's run, from its environment; starts the process group when the cloud has several ranks."""
    global _current
    env = _environment()
    fed = load_federation(env.get("CROSSCLOUD_FEDERATION") or None)
    cloud = env["CROSSCLOUD_CLOUD"]
    store = open_store(fed.cloud(cloud), env["CROSSCLOUD_TENANT"])
    plan = Plan.load(store, env["CROSSCLOUD_TENANT"], env["CROSSCLOUD_RUN_ID"])
    rank, world, local_rank = (int(env.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)))
    name, backend = select_device(plan.cloud(cloud).accelerator, local_rank)
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend)
    _current = Run(plan, cloud, store, rank, world, local_rank, device)
    if rank == 0:
        store.put(plan.keys.sdk_started(cloud), json.dumps({"device": str(device), "world_size": world}).encode())
    return _current


def current() -> Run | None:
    """The run ``init`` returned in this process, if the program called it."""
    return _current
