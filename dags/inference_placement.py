"""
### Inference placement

Serves a registered model on several clouds behind one router and sets each
cloud's share of the traffic by this hour's electricity prices. Runs every
hour and on demand (Params: tenant, model and alias, clouds, latency goal,
minimum share for warm standby).

1. **resolve** finds the version the alias names in the MLflow registry (its
   weights and the run's plan) and puts the weights in the run's home store by
   content; **find_cold** checks on which clouds the tenant's requests may be
   served (`jurisdictions`) the model and program are not warm yet.
2. **preheat** (one mapped task per cold cloud) fetches only the missing chunks
   from the nearest cloud holding them: a cloud gets a share only once it holds the model.
3. **place** reads the tokens the replicas served since the last run into the
   model's demand history and forecasts this hour's (the same hour a day
   before, else the last hour; the `tokens_per_s` Param overrides it), then
   solves the hour: per cloud the price per token (electricity price
   x energy per token of its accelerator x PUE, plus the device-hour price),
   its capacity in tokens/s, the p99 latency with its network distance from
   the users (`users_near`), residency, warm standby, and any grid request in
   force. Every cloud's reason is printed and kept in the tenant's store.
4. **apply** starts replicas where the plan wants more (each ready before it
   gets a share), sets the router's weights, and stops replicas it no longer
   needs once their in-flight requests finished. No request fails.
5. **record** logs the decision as a nested MLflow run of the experiment
   `inference_placement` (shares, replicas, cost per 1k tokens, reasons).

`crosscloud serve status` and the crosscloud page show the result; the
`demand_response` DAG moves traffic off a cloud for a grid request.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task


def _request():
    from crosscloud.serving.placement import ServingRequest

    p = get_current_context()["params"]
    return ServingRequest(tenant=p["tenant"], model=p["model"], alias=p["alias"], clouds=tuple(p["clouds"]),
                          users_near=p["users_near"], p99_goal_ms=p["latency_goal_ms"], min_share=p["min_share"],
                          context_mean=p["context_tokens"], generated_mean=p["generated_tokens"],
                          jurisdictions=tuple(p["jurisdictions"]))


@task
def resolve() -> dict:
    from crosscloud.core.federation import load_federation
    from crosscloud.serving.placement import publish
    from crosscloud.serving.placement import resolve as find_version
    from crosscloud.tracking.mlflow_runs import Tracker
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    req, fed = _request(), load_federation()
    version = find_version(Tracker().client, req.model, req.alias)
    spec = publish(fed, version, req.model, get_current_context()["params"]["tokenizer"] or None)
    print(f"{req.model}@{req.alias} = version {version.version} (run {version.run_id})")
    return {"spec": spec.__dict__, "clouds": req.chosen_clouds(fed),
            "version": {"name": version.name, "version": version.version, "run_id": version.run_id}}

@task
def find_cold(resolved: dict) -> list[str]:
    from crosscloud.core.federation import load_federation
    from crosscloud.serving.placement import warm_clouds
    from crosscloud.serving.replica import ServeSpec
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()  # each task is a process of its own, on any worker: the clouds' stores and hosts
    req, fed = _request(), load_federation()
    allowed = [c for c in resolved["clouds"] if req.allowed() is None or fed.cloud(c).jurisdiction in req.allowed()]
    warm = warm_clouds(fed, ServeSpec(**resolved["spec"]), allowed)
    print(f"warm where the requests may go: {warm}")
    return [c for c, w in warm.items() if not w]

@task(max_active_tis_per_dagrun=2)
def preheat(cloud: str, resolved: dict) -> dict:
    from crosscloud.core.federation import load_federation
    from crosscloud.serving.placement import preheat as fetch_to
    from crosscloud.serving.replica import ServeSpec
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    others = [c for c in resolved["clouds"] if c != cloud]
    report = fetch_to(load_federation(), ServeSpec(**resolved["spec"]), cloud, others)
    print(f"{cloud}: preheated, {report}")
    return report

@task(trigger_rule="none_failed")
def place(resolved: dict) -> dict:
    from crosscloud.core.federation import load_federation
    from crosscloud.serving.placement import decide_hour
    from crosscloud.serving.replica import ServeSpec
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    ctx = get_current_context()
    when = (ctx.get("data_interval_end") or ctx["dag_run"].run_after).timestamp()
    return decide_hour(load_federation(), _request(), ServeSpec(**resolved["spec"]), resolved["version"], when,
                       ctx["run_id"].replace(":", "-").replace("+", "-"), ctx["params"]["tokens_per_s"])

@task
def apply(record: dict) -> dict:
    from crosscloud.serving.fleet import Fleet
    from crosscloud.serving.replica import ServeSpec
    from crosscloud.serving.status import fleet_status, format_status
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    p, spec = get_current_context()["params"], ServeSpec(**record["spec"])
    fleet = Fleet(spec.tenant, spec.name)
    done = fleet.apply(spec, record["shares"], record["replicas"],
                       frozenset(record["request"]["jurisdictions"]) or None, p["router_port"])
    fleet.save_decision(record)
    print(f"router {done['router']}: started {done['started']}, stopped {done['stopped']}, weights {done['weights']}")
    print(format_status(fleet_status(fleet)))
    return done

@task
def record(decision: dict) -> str:
    from crosscloud.tracking.serving_hours import log_decision

    return log_decision(decision, decision["reason"])


@dag(
    dag_id="inference_placement",
    schedule=timedelta(hours=1),
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # one decision at a time: the router and replicas are shared
    doc_md=__doc__,
    tags=["crosscloud", "inference", "electricity"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    params={
        "tenant": Param("team-a", type="string", description="Tenant whose model is served."),
        "model": Param("crosscloud-team-a-byte-lm-small", type="string", description="Registered model name (MLflow): crosscloud-<tenant>-<the program's model name>."),
        "alias": Param("champion", type="string", description="Alias of the version to serve."),
        "clouds": Param([], type="array", items={"type": "string"},
                        description="Clouds that may serve (empty: every cloud the tenant has a quota on)."),
        "users_near": Param("", type="string", description="Cloud nearest the users, for network distance (empty: home)."),
        "latency_goal_ms": Param(2000.0, type="number", exclusiveMinimum=0, description="p99 latency goal, network included."),
        "min_share": Param(0.05, type="number", minimum=0, maximum=1, description="Share every usable cloud keeps (warm standby)."),
        "tokens_per_s": Param(None, type=["null", "number"], exclusiveMinimum=0,
                              description="Demand this hour, tokens/s, overriding the forecast from the traffic the "
                              "replicas served (empty: the forecast; 200 until any traffic was measured)."),
        "context_tokens": Param(64.0, type="number", exclusiveMinimum=0, description="Mean prompt tokens per request."),
        "generated_tokens": Param(16.0, type="number", exclusiveMinimum=0, description="Mean generated tokens per request."),
        "jurisdictions": Param([], type="array", items={"type": "string"},
                               description="Where the tenant's requests may be served (empty: anywhere)."),
        "tokenizer": Param("", type="string", description="hf-causal-lm models: the tokenizer.json its prepare.py "
                           "wrote, a path on the Airflow host, published as an artifact that is preheated and "
                           "warm-checked with the weights (empty for byte-lm)."),
        "router_port": Param(0, type="integer", minimum=0, maximum=65535,
                             description="Port of the router when it is first started (0: a free one)."),
    },
)
def inference_placement():
    resolved = resolve()
    warmed = preheat.partial(resolved=resolved).expand(cloud=find_cold(resolved))
    decision = place(resolved)
    warmed >> decision
    apply(decision) >> record(decision)


inference_placement()
