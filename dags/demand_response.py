"""
### Demand response

Answers a grid operator's request to cut one cloud's power, e.g.
`{"cloud": "beijing", "reduce_pct": 10, "within_s": 300, "duration_s": 3600}`
(trigger from the UI or `POST /api/v2/dags/demand_response/dagRuns`).

1. **respond** finds every run holding devices on the cloud (the reservation
   ledger), models the cloud's draw (busy devices at their caps, the rest
   idle, times PUE; fitted from measured DVFS curves) and picks, per run, the
   action that sheds enough for the least training progress: **throttle**
   (a lower power cap; throughput follows the DVFS curve) or **shift** (the
   cloud's share of the batch moves to the run's other clouds, which already
   hold the latest global checkpoint; its devices idle). Runs whose rounds
   are longer than `within_s` cannot answer in time and are named. It tells
   each run's coordinator, which applies the action from its next round.
   Served models (the `inference_placement` DAG's) on the cloud answer too:
   each re-plans its hour with the cut as a bound, moves that much of the
   cloud's traffic to its other clouds and lowers its replicas; **verify**
   turns the tokens/s the cloud's replicas served before and after into watts
   with the power model. Each workload sheds the asked share of its own draw.
2. **verify** waits until the cloud's sub-tasks show the action in their round
   commits and records time to shed, modelled power before and after and the
   progress given up; it fails if the cut did not hold within `within_s`.
3. **hold** waits, without holding a worker slot, until the request ends.
   The cloud's free devices are held from the queue for the request's
   duration (`crosscloud.grid.hold`: a reservation in the ledger the queue
   allocates from), so no new run starts there and adds its draw back.
4. **restore** (a teardown: it runs whatever happened) gives the runs their
   shares and full power back, the served models their traffic and the queue
   the held devices (their lease lapses by itself at the request's end); **record**
   keeps the outcome in each affected run's folder (`demand_response/`) and
   served model's (`serving/<model>/demand_response/`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, PokeReturnValue, dag, get_current_context, task


@task
def respond() -> dict:
    from crosscloud.core.federation import load_federation
    from crosscloud.energy.power import fit_power_curve
    from crosscloud.grid.demand_response import respond as plan_and_tell
    from crosscloud.grid.hold import give_back as release_hold
    from crosscloud.serving.grid import shed_all
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    p = get_current_context()["params"]
    plan, issued = plan_and_tell(load_federation(), p["cloud"], p["reduce_pct"], p["within_s"], fit_power_curve(),
                                 duration_s=p["duration_s"])
    print(f"{p['cloud']}: modelled draw {plan.before_w:.1f} W, target {plan.target_w:.1f} W, after {plan.after_w:.1f} W")
    print(f"{p['cloud']}: {plan.held_devices} free device(s) held from the queue for {p['duration_s']:g} s: no new run "
          "starts there while the request lasts")
    for a in plan.actions:
        print(f"  {a.run_id} ({a.tenant}): {a.kind} cap {a.cap:.0%}, saves {a.saved_w:.1f} W, "
              f"gives up {a.progress_lost:.1%} of its throughput")
    for why in plan.refused:
        print(f"  refused: {why}")
    serving = shed_all(p["cloud"], p["reduce_pct"], p["within_s"], p["duration_s"])
    for s in serving:
        print(f"  serving {s['tenant']}/{s['model']}: share {s['share_before']:.2f} -> {s['share_after']:.2f}, "
              f"replicas {s['replicas_before']} -> {s['replicas_after']}")
    if not (plan.actions or plan.refused or serving):
        release_hold(p["cloud"])
        raise RuntimeError(f"{p['cloud']}: no training run and no served model there: nothing crosscloud runs can shed")
    return {"plan": plan.to_dict(), "issued_at": issued, "serving": serving}

@task
def verify(answer: dict) -> dict:
    from crosscloud.core.federation import load_federation
    from crosscloud.energy.power import fit_power_curve
    from crosscloud.grid.demand_response import ShedPlan
    from crosscloud.grid.demand_response import verify as check
    from crosscloud.serving.grid import verify_all
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()  # the replicas' meters are read on their clouds' hosts
    p = get_current_context()["params"]
    plan = ShedPlan.from_dict(answer["plan"])
    serving = verify_all(answer["serving"], p["within_s"])
    for s in serving:
        print(f"serving {s['tenant']}/{s['model']}: held {s['held']}, {s['shed_pct']:.1f}% of its modelled draw "
              f"at the tokens/s its replicas served ({s['tokens_per_s_before']:.0f} -> {s['tokens_per_s_after']:.0f})")
    if not (plan.actions or plan.refused):  # no training run on the cloud: serving alone answers
        result = {"cloud": plan.cloud, "held": all(s["held"] for s in serving), "actions": [], "refused": []}
    else:
        result = check(load_federation(), plan, answer["issued_at"], fit_power_curve(), timeout_s=p["within_s"])
        print(f"training: cut held: {result['held']} after {result['time_to_shed_s']} s, {result['shed_pct']:.1f}% shed")
    result = {**result, "serving": serving}
    failed = [f"{s['tenant']}/{s['model']} shed {s['shed_pct']:.1f}%" for s in serving if not s["held"]]
    if not result["held"] or failed:
        why = "; ".join(failed) or (f"the metered draw fell by only {result['measured_shed_pct']:.1f}%"
                                    if result.get("measured_shed_pct") is not None else "the runs did not apply it in time")
        raise RuntimeError(f"{plan.cloud}: the cut of {plan.reduce_pct:g}% did not hold within {plan.within_s:g} s: "
                           f"{result['refused'] or why}")
    return result

@task.sensor(poke_interval=30, timeout=7 * 24 * 3600, mode="reschedule")
def hold(answer: dict) -> PokeReturnValue:
    import time

    p = get_current_context()["params"]
    return PokeReturnValue(is_done=time.time() >= answer["issued_at"] + p["duration_s"])

@task(trigger_rule="all_done")
def restore(answer: dict) -> None:
    from crosscloud.core.federation import load_federation
    from crosscloud.grid.demand_response import ShedPlan
    from crosscloud.grid.demand_response import restore as give_back
    from crosscloud.serving.grid import restore_all
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    give_back(load_federation(), ShedPlan.from_dict(answer["plan"]))
    for back in restore_all(answer["serving"]):
        print(f"serving {back['tenant']}/{back['model']}: share {back['share']:.2f} and {back['replicas']} replica(s) back")

@task
def record(result: dict) -> None:
    import json

    from crosscloud.core.federation import load_federation
    from crosscloud.core.keys import RunKeys
    from crosscloud.store.open_store import open_store

    fed, run_id = load_federation(), get_current_context()["run_id"].replace(":", "-").replace("+", "-")
    for a in result["actions"]:
        key = f"{RunKeys(a['tenant'], a['run_id']).root}/demand_response/{run_id}.json"
        open_store(fed.local_cloud, a["tenant"]).put(key, json.dumps(result, indent=2).encode())
    for s in result["serving"]:
        key = f"{s['tenant']}/serving/{s['model']}/demand_response/{run_id}.json"
        open_store(fed.local_cloud, s["tenant"]).put(key, json.dumps(s, indent=2).encode())


@dag(
    dag_id="demand_response",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # one grid request at a time: a second would overwrite the first's directives
    doc_md=__doc__,
    tags=["crosscloud", "electricity"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    params={
        "cloud": Param("beijing", type="string", description="Cloud whose grid asks for less power."),
        "reduce_pct": Param(10.0, type="number", exclusiveMinimum=0, maximum=100, description="Cut asked for, in % of its draw."),
        "within_s": Param(300.0, type="number", exclusiveMinimum=0, description="Seconds the cut must hold within."),
        "duration_s": Param(3600.0, type="number", minimum=0, description="How long the request lasts."),
    },
)
def demand_response():
    answer = respond()
    checked = verify(answer)
    held = hold(answer)
    checked >> held
    done = restore(answer)
    held >> done.as_teardown(setups=answer)
    done >> record(checked)


demand_response()
