"""The stages of one cross-cloud training run, as plain functions.

The DAG ``cross_cloud_training`` calls each stage from its own task; benchmarks
and the baseline calibration call ``run_job``, which runs the same stages in
one process. A stage finds everything by ``RunRef`` (federation, tenant, run
id): the plan in the home cloud's store is the single source of truth.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable


from crosscloud.artifacts.preheat import TransferReport, fetch_all
from crosscloud.pipeline.probe import probes
from crosscloud.pipeline.inputs import LoadedProgram, RunInputs, StartFrom, load_job_program, materialize_inputs
from crosscloud.backends import Handle, get_backend
from crosscloud.core.federation import Federation, read_federation
from crosscloud.core.federation import federation_path as resolve_federation_path
from crosscloud.core.deployment import require_single_host
from crosscloud.core.interrupt import terminate_as_interrupt
from crosscloud.core.job import JobSpec
from crosscloud.core.keys import PARAMS, manifest_key, validate_name
from crosscloud.core.presets import preset
from crosscloud.scheduler.admission import Admission, NotAdmitted, admit, admit_waiting, preflight
from crosscloud.scheduler.sizing import Sizing, measured_figures, resolve_sizing
from crosscloud.ledger import Ledger
from crosscloud.pool.partition import partition
from crosscloud.pool.placement import PlacementError
from crosscloud.run import baseline, lease
from crosscloud.run.history import load_history
from crosscloud.run.plan import Candidate, Plan
from crosscloud.store.base import StoreError
from crosscloud.store.chunks import BlobRef, ChunkIndex, warmth
from crosscloud.store.commit import copy_object, iter_object, read_commit, write_step
from crosscloud.store.credentials import require_credentials
from crosscloud.store.network import nearest_first, store_seen_from
from crosscloud.store.digest import sha256
from crosscloud.store.open_store import open_store
from crosscloud.tracking import plots, registry
from crosscloud.tracking.mlflow_runs import Tracker
from crosscloud.tracking.run_report import load_run
from crosscloud.pipeline.subtasks import dispatch_stage, run_handles, stop_run, watcher
from crosscloud.run.ref import RunRef

Log = Callable[[str], None]


def _holders(fed: Federation, tenant: str, refs: list[BlobRef]) -> set[str]:
    """Clouds already warm for every one of ``refs`` (content-addressed, so any earlier run's copy counts)."""
    holders = set()
    for cloud in fed.clouds:
        try:
            store = open_store(cloud, tenant)
            index = ChunkIndex(store, tenant)
            if all(warmth(store, tenant, r, index=index).warm for r in refs):
                holders.add(cloud.name)
        except StoreError:  # a store placement cannot read now holds nothing it can count on
            continue
    return holders


def _check_runnable(fed: Federation, spec: JobSpec, family: str, sizing: Sizing) -> None:
    """Fail what can never run before any input is written: held-out residency, placement, credentials."""
    ds = fed.dataset(spec.dataset)
    if ds.residency and fed.local_cloud.jurisdiction != ds.residency:
        raise PlacementError(f"dataset {ds.name} is resident in {ds.residency}; its held-out part cannot be evaluated on {fed.local_cloud.name}")
    preflight(fed, spec, family, sizing=sizing)
    usable = spec.usable_clouds(fed)
    for name in usable:
        if fed.cloud(name).access.method == "local":
            require_single_host(f"cloud {name}'s access method local (sub-tasks as processes of the host that "
                                "dispatches them)", "reach the cloud by ssh or kubernetes (docs/federation.md)")
    require_credentials([fed.cloud(n) for n in sorted({ds.home, fed.local_cloud.name, *usable})], spec.tenant)


def _sizing(ledger: Ledger, spec: JobSpec, program: LoadedProgram) -> Sizing:
    """What the run's samples and memory cost, from the best figures known of its program and model."""
    measured = (ledger.figures.lookup(spec.tenant, sha256(program.code), program.architecture)
                if program.architecture else {})
    return resolve_sizing(spec, measured, program.declared, program.parameters)


def _probe(fed: Federation, ref: RunRef, spec: JobSpec, program: LoadedProgram, ledger: Ledger, log: Log) -> None:
    """Measure the program where no run has yet (``pipeline.probe``). A probe that cannot start now (no free
    device) or fails leaves that accelerator type to the estimate, and says so; the run goes on."""
    for probe in probes(fed, spec, program.family, sha256(program.code), program.architecture, ledger):
        run_id = probe.run_id(ref.run_id)
        log(f"run {ref.run_id}: probing {program.ref_name} on {probe.cloud} ({probe.accelerator}): "
            f"{probe.spec.inner_steps} steps of {probe.spec.global_batch} in run {run_id}")
        try:
            run_job(probe.spec, run_id, ref.federation_path, log=log, compare_baseline=False, wait=False,
                    program=program)
        except NotAdmitted as exc:
            log(f"run {ref.run_id}: no probe on {probe.cloud} now ({exc}); {probe.accelerator} sized by estimate")
        except Exception as exc:  # noqa: BLE001 - whatever the probe met, the run itself decides and says
            log(f"run {ref.run_id}: the probe on {probe.cloud} failed ({type(exc).__name__}: {exc}); "
                f"{probe.accelerator} sized by estimate")


def _new_plan(fed: Federation, ref: RunRef, spec: JobSpec, admission: Admission, inputs: RunInputs,
              sizing: Sizing) -> Plan:
    """The plan of an admitted run: each cloud's share and shards, the candidates placement weighed, the inputs."""
    cfg = preset(spec.model_size)
    return Plan(
        tenant=spec.tenant,
        run_id=ref.run_id,
        federation=fed.name,
        federation_path=ref.federation_path,
        federation_sha256=ref.federation_sha256,
        job=spec,
        model=cfg,
        outer=spec.outer,
        coordinator_cloud=fed.local_cloud.name,
        clouds=partition(fed, spec, inputs.program.family, admission.parts, len(inputs.shards)),
        candidates=[Candidate(cloud=c.cloud, accelerator=c.accelerator, chosen=c.chosen, reason=c.reason)
                    for c in admission.considered],
        dataset=spec.dataset,
        shards=inputs.shards,
        held_out=inputs.held_out,
        init=inputs.init,
        program=inputs.program,
        shard_names=inputs.shard_names,
        held_out_names=inputs.held_out_names,
        sizing={"source": sizing.source, "measured": sizing.measured, "memory_gb": sizing.memory_gb,
                "seconds_per_sample": sizing.seconds_per_sample, "parameters": sizing.parameters},
        created_at=time.time(),
    )


def _queued(ledger: Ledger, tenant: str, run_id: str) -> dict | None:
    """How the run waited in the queue, for MLflow; None for a run that did not come through it."""
    row = ledger.queue.get(tenant, run_id)
    if row is None or row.started_at is None:
        return None
    decision = (json.loads(row.decision) or {}) if row.decision else {}
    when = "" if row.deadline is None else time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(row.deadline))
    saved = decision.get("saved") or (None, None)
    return {"waited_s": row.started_at - row.submitted_at, "priority": row.priority, "deadline": when,
            "deferrable": row.deferrable, "objective": row.objective, "reason": decision.get("reason", ""),
            "saved_usd": saved[0], "saved_kg_co2": saved[1]}


def _write_plan(fed: Federation, plan: Plan, experiment: str | None, tags: dict[str, str] | None,
                queued: dict | None = None) -> None:
    """Open the run's MLflow runs (when it is tracked) and store the plan on the local cloud."""
    if experiment:
        plan.tracking = Tracker().start_job(plan, experiment, tags or {}, queued)
    plan.save(open_store(fed.local_cloud, plan.tenant))


def admit_stage(
    spec: JobSpec,
    run_id: str,
    federation_path: str | None = None,
    experiment: str | None = None,
    tags: dict[str, str] | None = None,
    init: StartFrom | None = None,
    wait: bool = False,
    log: Log = print,
    wait_s: float | None = None,
    program: LoadedProgram | None = None,
) -> RunRef:
    """Admit the run (it enters the queue; once a pass starts it, its devices are reserved), give clouds shares
    and shards, write the plan, open MLflow runs.

    Raises ``NotAdmitted`` while the run waits in the queue (unless ``wait``: then
    it waits here, saying its position, for at most ``wait_s`` if given) and
    ``PlacementError`` when no cloud could ever take it.
    """
    validate_name(run_id, "run id")
    federation_path = str(resolve_federation_path(federation_path))
    fed, digest = read_federation(federation_path)
    ref = RunRef(federation_path, spec.tenant, run_id, digest)
    program = program or load_job_program(spec)  # described once: a retrain's caller has done it already
    spec = dataclasses.replace(spec, dataset=spec.dataset or program.dataset)
    ledger = Ledger()
    _probe(fed, ref, spec, program, ledger, log)
    sizing = _sizing(ledger, spec, program)
    log(f"run {run_id}: sized by {sizing.source}")
    _check_runnable(fed, spec, program.family, sizing)
    inputs = materialize_inputs(fed, spec, program, init)
    if experiment and spec.mode == "cross_cloud" and inputs.program.architecture:  # it will register: refused now
        registry.check_architecture(Tracker().client, registry.model_name(spec.tenant, program.model_name),
                                    inputs.program.architecture, f"run {run_id}")
    data_bytes, data_at = sum(r.size for r in inputs.shards), _holders(fed, spec.tenant, inputs.shards)
    if wait:
        admission = admit_waiting(fed, spec, run_id, program.family, data_bytes, data_at, ledger, log, timeout_s=wait_s,
                                  sizing=sizing)
    else:
        admission = admit(fed, spec, run_id, program.family, data_bytes, data_at, ledger, sizing=sizing)
    try:
        _write_plan(fed, _new_plan(fed, ref, spec, admission, inputs, sizing), experiment, tags,
                    _queued(ledger, spec.tenant, run_id))
    except BaseException:
        ledger.release(spec.tenant, run_id)  # a run that never got its plan holds no devices
        raise
    return ref


def release_stage(ref: RunRef) -> int:
    """Give back the devices the run reserved; returns how many it held."""
    return Ledger().release(ref.tenant, ref.run_id)


def preheat_stage(ref: RunRef) -> dict:
    """Make every chosen cloud hold what its sub-task reads, then publish round 0 there.

    Chunks come from the nearest cloud holding them (the dataset's home, the
    local cloud, or a cloud preheated before), only those the target lacks.
    """
    fed, plan = ref.load()
    with lease.held(plan.tenant, plan.run_id):  # a large model's preheat may outlast the lease
        return _preheat(fed, plan)


def _preheat(fed: Federation, plan: Plan) -> dict:
    report = TransferReport()
    home = open_store(fed.local_cloud, plan.tenant)
    stores = {c.name: store_seen_from(fed, c.name, fed.local_cloud.name, plan.tenant) for c in plan.clouds}
    holders = {fed.dataset(plan.dataset).home, fed.local_cloud.name}
    for cloud in plan.clouds:
        names = nearest_first(fed, cloud.name, sorted(holders | set(stores)))
        sources = [stores.get(n) or open_store(fed.cloud(n), plan.tenant) for n in names]
        fetch_all(stores[cloud.name], sources, plan.tenant, plan.needs(cloud.name), report)
        plan.save(stores[cloud.name])
    if plan.init is not None:  # given weights are global 0 (without them the builder cloud's sub-task builds it)
        round0 = plan.keys.global_step(0)
        init_entry = {"artifact": manifest_key(plan.tenant, plan.init.sha256), "size": plan.init.size,
                      "sha256": plan.init.sha256}
        meta = {"round": -1, "published_at": time.time()}
        # the home cloud's store last: its commit marks global 0 published
        for store in [s for name, s in stores.items() if name != fed.local_cloud.name] + [home]:
            if read_commit(store, round0) is None:
                write_step(store, round0, {}, refs={PARAMS: init_entry}, meta=meta)
    result = report.to_dict()
    home.put(f"{plan.keys.root}/preheat.json", json.dumps(result, indent=2).encode())
    return result


def run_tracker(plan: Plan):
    """MLflow's tracker of a tracked run; None when the run is not tracked."""
    if not plan.tracking:
        return None
    return Tracker()


def track_round(plan: Plan, tracker, log: Log) -> Callable[[dict], None]:
    """Records each round in MLflow as the watcher records it; an MLflow outage is retried, then only logged."""

    def on_round(record: dict) -> None:
        if tracker is None:
            return
        for attempt in range(3):
            try:
                tracker.log_round(plan, record)
                return
            except Exception as exc:  # noqa: BLE001 - MLflow down, whatever it raises: the round stays in history.json
                log(f"round {record['round']}: MLflow did not take the round ({exc}); attempt {attempt + 1} of 3")
                time.sleep(1.0 + attempt)

    return on_round


def sync_stage(ref: RunRef, handles: list[Handle], log: Log = print) -> list[dict]:
    """Watch the run in this process until every round is recorded (the clouds do the exchange)."""
    _, plan = ref.load()
    return watcher(ref, handles, log).run(track_round(plan, run_tracker(plan), log))


def _wait_for_exit(handles: list[Handle], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for handle in handles:
        backend = get_backend(handle["backend"])
        while backend.state(handle) == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
        backend.stop(handle)


def _baseline(plan: Plan, experiment: str | None, log: Log) -> dict | None:
    """The matching single-cluster baseline from MLflow, or a short calibration run of it.

    None, said in the log, when no single cloud can hold the same devices or they
    are taken now: a smaller baseline would flatter the gap, and the finished
    training must not fail for want of a comparison.
    """
    key = baseline.baseline_key(plan)
    if experiment:
        found = Tracker().find_baseline(experiment, key)
        if found:
            log(f"baseline: MLflow run {found['run_id']} ({found['iteration_time_s'] * 1000:.1f} ms/step)")
            return {"source": "mlflow", **found}
    spec = baseline.calibration_spec(plan)
    log(f"baseline: none recorded for key {key}; calibrating {spec.rounds} single-cluster rounds on {spec.clouds[0]}, "
        f"waiting in the queue at priority {spec.priority} for at most {baseline.CALIBRATION_WAIT_S:.0f} s")
    try:
        summary = run_job(spec, f"{plan.run_id}.baseline", plan.federation_path, experiment, log=log,
                          wait_s=baseline.CALIBRATION_WAIT_S)
    except (PlacementError, NotAdmitted) as exc:
        log(f"baseline: no calibration run ({exc}); the run is reported without a gap")
        return None
    return {"source": "calibration", "run_id": summary["run_id"], "iteration_time_s": summary["metrics"]["iteration_time_s"],
            "final_eval_loss": summary["metrics"]["final_eval_loss"]}


def _cloud_summary(fed: Federation, plan: Plan, history: list[dict], train_s: float) -> dict:
    clouds = {}
    for c in plan.clouds:
        pool = next(p for p in fed.cloud(c.name).pools if p.accelerator == c.accelerator)
        rounds = [r["clouds"][c.name] for r in history if c.name in r["clouds"]]  # a lost cloud left no record
        steps = [s for r in rounds for s in r["step_s"]] or [0.0]  # a cloud idle all run trained no step
        device_hours = c.devices * train_s / 3600
        clouds[c.name] = {
            "share": c.share,
            "devices": c.devices,
            "mean_iteration_time_s": sum(steps) / len(steps),
            "compute_s": sum(r["compute_s"] for r in rounds),
            "comm_s": sum(r["upload_s"] + r["download_s"] for r in rounds),
            "wait_s": sum(r["wait_s"] for r in rounds),
            "cost": device_hours * pool.price_per_device_hour,
            "energy_kwh": device_hours * pool.power_w / 1000,
        }
    return clouds


def _final_model(ref: RunRef, plan: Plan, home, handles: list[Handle], hold: lease.Lease) -> tuple[list[dict], dict]:
    """Once the sub-tasks have exited: the run's history and final model, the latter committed as the run's.

    The final model is the home cloud's copy of the last global, referred to where
    it lies (no byte is copied); when the home cloud left the run, another cloud's
    copy is streamed to the home store. The devices go back first: training is
    over, and a calibration run may need them.
    """
    spec = plan.spec
    _wait_for_exit(handles)
    hold.release()
    history = load_history(home, plan)
    if len(history) != spec.rounds:
        raise RuntimeError(f"run {plan.run_id}: {len(history)} of {spec.rounds} rounds recorded; rerun sync_checkpoints")
    fed = ref.load()[0]
    last = plan.keys.global_step(spec.rounds)
    for cloud in sorted(history[-1]["clouds"], key=lambda c: c != plan.coordinator_cloud):
        store = home if cloud == plan.coordinator_cloud else store_seen_from(fed, cloud, plan.coordinator_cloud, plan.tenant)
        commit = read_commit(store, last)
        if commit is None:
            continue
        entry = commit["objects"][PARAMS]
        if store is not home:
            entry = copy_object(store, entry, home, f"{plan.keys.final}/model.safetensors")
        write_step(home, plan.keys.final, {}, refs={"model.safetensors": entry},
                   meta={"rounds": spec.rounds, "digest": commit["meta"].get("digest"), "from": cloud})
        return history, entry
    raise RuntimeError(f"run {plan.run_id}: no cloud holds global {spec.rounds}, the final model")


def _eval_losses(plan: Plan, home, log: Log) -> tuple[float, float]:
    """Held-out loss of the initial and the final global, as the clouds evaluated them (NaN where none did)."""
    found = []
    for g in (0, plan.spec.rounds):
        try:
            found.append(float(json.loads(home.get(plan.keys.evaluation(g)))["eval_loss"]))
        except StoreError:
            log(f"run {plan.run_id}: global {g} was not evaluated (its evaluating cloud left the run)")
            found.append(float("nan"))
    return found[0], found[1]


def _run_summary(plan: Plan, history: list[dict], clouds: dict, train_s: float, evals: tuple[float, float],
                 base: dict | None) -> dict:
    """The run's summary: per-cloud figures, whole-run metrics, the gap to the baseline, and each round's numbers."""
    spec, (eval_start, eval_end) = plan.spec, evals
    it_s = baseline.iteration_time(history, spec.inner_steps)
    return {
        "run_id": plan.run_id,
        "tenant": plan.tenant,
        "mode": spec.mode,
        "clouds": clouds,
        "rounds": spec.rounds,
        "inner_steps": spec.inner_steps,
        "baseline": base,
        "metrics": {
            "eval_loss_start": eval_start,
            "final_eval_loss": eval_end,
            "iteration_time_s": it_s,
            "baseline_iteration_time_s": base["iteration_time_s"] if base else None,
            "iteration_time_gap_pct": baseline.gap_pct(it_s, base["iteration_time_s"]) if base else None,
            "train_wall_s": train_s,
            "cost": sum(c["cost"] for c in clouds.values()),
            "energy_kwh": sum(c["energy_kwh"] for c in clouds.values()),
        },
        "history": [
            {**{k: v for k, v in r.items() if k != "clouds"},
             "clouds": {c: {k: v for k, v in rec.items() if isinstance(v, (int, float))} for c, rec in r["clouds"].items()}}
            for r in history
        ],
    }


def _global0_sha256(fed: Federation, plan: Plan, home) -> str:
    """The digest of the run's global 0: its given weights, or what its builder cloud committed (global 0 is
    kept to the end of a run)."""
    if plan.init is not None:
        return plan.init.sha256
    local = fed.local_cloud.name
    store = home if plan.builder == local else store_seen_from(fed, plan.builder, local, plan.tenant)
    commit = read_commit(store, plan.keys.global_step(0))
    return commit["objects"][PARAMS]["sha256"] if commit else ""


def _register_model(tracker, plan: Plan, summary: dict, home, entry: dict) -> dict:
    """Log and register the final model in MLflow's registry; returns its name, version and source."""
    return registry.register(tracker.client, plan, summary, iter_object(home, entry))


def _close_tracking(tracker, fed: Federation, plan: Plan, summary: dict, history: list[dict], handles: list[Handle]) -> None:
    """Log the run's plots and the sub-tasks' logs to MLflow and close its runs."""
    started = history[0]["published_at"] - history[0]["wall_s"]
    plots.log_plots(tracker.client, fed, load_run(fed, plan.tenant, plan.run_id), baseline.baseline_key(plan),
                    started, history[-1]["published_at"])
    logs = {h["cloud"]: get_backend(h["backend"]).logs(h)[0] for h in handles}
    tracker.finish(plan, summary, logs)


def aggregate_stage(ref: RunRef, handles: list[Handle], experiment: str | None = None, log: Log = print,
                    compare_baseline: bool = True) -> dict:
    """Final model and evaluation, whole-run metrics, the baseline gap; closes the MLflow runs."""
    fed, plan = ref.load()
    with lease.held(plan.tenant, plan.run_id, log) as hold:
        return _aggregate(ref, fed, plan, handles, experiment, log, compare_baseline, hold)


def _aggregate(ref: RunRef, fed: Federation, plan: Plan, handles: list[Handle], experiment: str | None, log: Log,
               compare_baseline: bool, hold: lease.Lease) -> dict:
    home = open_store(fed.local_cloud, plan.tenant)
    history, final = _final_model(ref, plan, home, handles, hold)
    evals = _eval_losses(plan, home, log)
    train_s = sum(r["wall_s"] for r in history)
    clouds = _cloud_summary(fed, plan, history, train_s)
    base = _baseline(plan, experiment, log) if plan.spec.mode == "cross_cloud" and compare_baseline else None
    if figures := measured_figures(plan, history):  # the next run of this program and model is sized by them
        store = Ledger().figures
        for figure in figures:
            store.record(figure)
    summary = {**_run_summary(plan, history, clouds, train_s, evals, base), "init_sha256": _global0_sha256(fed, plan, home)}
    tracker = run_tracker(plan)
    if tracker and plan.spec.mode == "cross_cloud":  # a single-cluster baseline is a measurement, not a model to serve
        summary["model"] = _register_model(tracker, plan, summary, home, final)
    home.put(plan.keys.summary, json.dumps(summary, indent=2).encode())
    if tracker:
        _close_tracking(tracker, fed, plan, summary, history, handles)
    return summary


def run_job(spec: JobSpec, run_id: str, federation_path: str | None = None, experiment: str | None = None,
            log: Log = print, compare_baseline: bool = True, tags: dict[str, str] | None = None,
            init: StartFrom | None = None, wait: bool = True, wait_s: float | None = None,
            program: LoadedProgram | None = None) -> dict:
    """All stages in this process, through the engine backends: for benchmarks, calibration and retraining.

    The run waits in the queue like any other (``wait=False``: it fails at once
    with ``NotAdmitted`` instead; ``wait_s``: after that long). However it ends - an error, Ctrl-C, SIGTERM -
    its sub-tasks are stopped and its devices given back.
    """
    with terminate_as_interrupt():
        ref = admit_stage(spec, run_id, federation_path, experiment,
                          tags={"crosscloud.launcher": "engine", **(tags or {})}, init=init, wait=wait, log=log,
                          wait_s=wait_s, program=program)
        handles: list[Handle] = []
        try:
            preheat_stage(ref)
            _, plan = ref.load()
            try:
                for c in plan.clouds:
                    handles.append(dispatch_stage(ref, c.name))
                sync_stage(ref, handles, log)
            except BaseException:  # nothing watches any more: stop the sub-tasks (the DAG's cleanup does it there)
                stop_run(ref, handles + [h for h in run_handles(ref) if h not in handles])
                if plan.tracking:
                    Tracker().fail(plan)
                raise
            return aggregate_stage(ref, handles, experiment, log, compare_baseline)
        finally:
            release_stage(ref)
