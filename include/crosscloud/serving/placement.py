"""One placement hour of a served model: which registered version, where it is warm, each cloud's share.

Why these steps in this order (the ``inference_placement`` DAG runs them as
tasks): the version is resolved once (registry name and alias), its weights and
program code are put in the run's home store by content, every cloud the
tenant's requests may go to is preheated *before* the plan, so a cloud joins
with a share only once it holds the model, and the plan is solved last, on this
hour's prices, with the grid cuts in force. The result is a decision record:
the inputs and every cloud's reason, kept in the store and in MLflow, and read
back by a grid request to re-plan from the same figures.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from crosscloud.artifacts.preheat import TransferReport, fetch_all
from crosscloud.core.federation import Federation
from crosscloud.run.plan import Plan
from crosscloud.serving.demand import Demand, expected_tokens_per_s
from crosscloud.serving.energy import ServedModel
from crosscloud.serving.fleet import Fleet
from crosscloud.serving.offers import RequestMix, federation_offers, offer_from_dict, offer_to_dict, served_model
from crosscloud.serving.replica import ServeSpec
from crosscloud.serving.traffic import CloudOffer, Goal, GridCut, TrafficPlan, place_traffic, sized_ahead
from crosscloud.store.base import ObjectStore
from crosscloud.store.chunks import BLOB_TEXT, BlobRef, put_blob, read_blob, warmth
from crosscloud.store.network import nearest_first
from crosscloud.store.open_store import open_store


class ServingPlacementError(ValueError):
    """A placement that cannot be made: no such model version, no cloud allowed, a cloud that cannot be warmed."""


@dataclass(frozen=True)
class ServingRequest:
    """What the tenant asks of an hour (the DAG's Params)."""

    tenant: str
    model: str  # registered model name
    alias: str = "champion"
    clouds: tuple[str, ...] = ()  # empty: every cloud the tenant has a quota on
    users_near: str = ""  # the cloud nearest the tenant's users (network distance); empty: the home cloud
    p99_goal_ms: float = 2000.0
    min_share: float = 0.0
    tokens_per_s: float = 200.0  # the demand expected this hour
    context_mean: float = 64.0
    generated_mean: float = 16.0
    jurisdictions: tuple[str, ...] = ()  # where requests may be served; empty: anywhere
    devices_per_replica: int = 1

    def allowed(self) -> frozenset[str] | None:
        return frozenset(self.jurisdictions) if self.jurisdictions else None

    def mix(self) -> RequestMix:
        return RequestMix(self.context_mean, self.generated_mean)

    def goal(self) -> Goal:
        return Goal(self.tokens_per_s, self.p99_goal_ms / 1000, self.allowed(), self.min_share)

    def chosen_clouds(self, fed: Federation) -> list[str]:
        quotas = fed.tenant(self.tenant).quotas
        return list(self.clouds) or [c.name for c in fed.clouds if quotas.get(c.name, 0) > 0]


@dataclass
class Version:
    """A registered model version as serving needs it: the run's plan and its weights' bytes."""

    name: str
    version: int
    run_id: str
    plan: Plan
    weights: bytes = field(repr=False)


def resolve(client, name: str, alias: str) -> Version:
    """The version ``alias`` points to, with the plan and weights logged beside it (``tracking.registry``)."""
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    from crosscloud.tracking.registry import ARCHITECTURE, RegistryMismatch, check_architecture, weights

    try:
        version = client.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        raise ServingPlacementError(f"registered model {name!r} has no version with alias {alias!r}: {e.message}") from None
    if ARCHITECTURE in version.tags:  # a router's replicas all answer with one architecture, the champion's
        try:
            check_architecture(client, name, version.tags[ARCHITECTURE], f"serving {name} @{alias} (version "
                               f"{version.version})")
        except RegistryMismatch as e:
            raise ServingPlacementError(str(e)) from None
    with tempfile.TemporaryDirectory() as tmp:
        plan = Plan.model_validate(json.loads(Path(download_artifacts(artifact_uri=f"{version.source}/plan.json",
                                                                      dst_path=tmp)).read_text()))
    return Version(name, int(version.version), version.run_id, plan, weights(client, version))


def publish(fed: Federation, version: Version, served_name: str, tokenizer: str | None = None) -> ServeSpec:
    """Put the weights in the run's home store (by content: a no-op when the run left them there); the spec to serve.

    ``tokenizer``: an hf-causal-lm model's ``tokenizer.json`` (byte-lm needs none)."""
    plan = version.plan
    if plan.program is not None and plan.program.family != "byte-lm" and not tokenizer:
        raise ServingPlacementError(f"{version.name} v{version.version} is a {plan.program.family} model: give its "
                                    "tokenizer.json (the DAG's Param tokenizer)")
    home = open_store(fed.cloud(plan.coordinator_cloud), plan.tenant)
    ref, _ = put_blob(home, plan.tenant, version.weights, kind="model")
    return ServeSpec.from_plan(plan, served_name, ref, tokenizer_artifact(home, plan.tenant, tokenizer))


def tokenizer_artifact(home: ObjectStore, tenant: str, tokenizer: str | None) -> str | None:
    """The tokenizer file put in the home store by content (sha256:size): preheated and warm-checked with the
    weights, so every cloud's replica decodes with the same file; an artifact already named by content is kept."""
    if not tokenizer or BLOB_TEXT.fullmatch(tokenizer):
        return tokenizer
    try:
        data = Path(tokenizer).read_bytes()
    except OSError as exc:
        raise ServingPlacementError(f"tokenizer {tokenizer}: cannot read it here ({exc.strerror}); give the path of "
                                    "prepare.py's tokenizer.json on this host") from None
    return put_blob(home, tenant, data, kind="tokenizer")[0].text


def needed(spec: ServeSpec) -> list[BlobRef]:
    """What a replica reads at start: the weights, the program's code and the tokenizer, each an artifact."""
    refs = [spec.model] + ([spec.program_code] if spec.program_code else [])
    refs += [spec.tokenizer] if spec.tokenizer and BLOB_TEXT.fullmatch(spec.tokenizer) else []
    return [BlobRef.parse(r) for r in refs]


def warm_clouds(fed: Federation, spec: ServeSpec, clouds: list[str]) -> dict[str, bool]:
    """Whether each cloud holds everything a replica reads (the warm check of the artifacts)."""
    return {c: all(warmth(open_store(fed.cloud(c), spec.tenant), spec.tenant, ref).warm for ref in needed(spec))
            for c in clouds}


def preheat(fed: Federation, spec: ServeSpec, cloud: str, holders: list[str]) -> dict:
    """Fetch what a replica reads to ``cloud`` from the nearest clouds holding it; only missing chunks travel."""
    report = TransferReport()
    sources = [open_store(fed.cloud(c), spec.tenant) for c in nearest_first(fed, cloud, holders)]
    fetch_all(open_store(fed.cloud(cloud), spec.tenant), sources, spec.tenant, needed(spec), report)
    return report.to_dict()


def local_step_s(fed: Federation, spec: ServeSpec, weights: bytes, mix: RequestMix, repeats: int = 3) -> float:
    """A local replica's time per generated token for the tenant's mean request, measured here as a replica runs.

    Local clouds' replicas run on this host, one torch thread each, so this is
    what their capacity is; the model is built exactly as the server builds it.
    """
    import torch

    from crosscloud.serving.server import build_engine, program_file, tokenizer_file

    store = open_store(fed.local_cloud, spec.tenant)
    engine = build_engine(program_file(store, spec.tenant, spec.program, spec.program_code), spec.args, weights,
                          tokenizer_file(store, spec.tenant, spec.tokenizer))
    prompt, tokens = "x" * int(mix.context_mean), max(1, int(mix.generated_mean))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine.complete(prompt, 2, 0.0)  # first call allocates
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, _, made, _ = engine.complete(prompt, tokens, 1.0, seed=0)
            times.append((time.perf_counter() - t0) / max(made, 1))
    finally:
        torch.set_num_threads(threads)
    return sorted(times)[len(times) // 2]


def plan_hour(fed: Federation, req: ServingRequest, model: ServedModel, warm: dict[str, bool], when: float,
              cuts: dict[str, dict], in_force: dict[str, float] | None = None,
              step_s: float | None = None, family: str | None = None) -> tuple[TrafficPlan, list[CloudOffer]]:
    """This hour's traffic plan: offers of the chosen clouds at ``when``'s prices, the grid cuts in force."""
    offers, refused = federation_offers(fed, req.tenant, req.chosen_clouds(fed), model, req.mix(), when,
                                        req.users_near or fed.local_cloud.name, warm, req.goal().max_utilisation,
                                        step_s, family)
    if not offers:
        raise ServingPlacementError("no cloud can serve: " + "; ".join(f"{c.cloud}: {c.reason}" for c in refused))
    grid = grid_cuts(cuts, offers)
    plan = place_traffic(req.goal(), offers, grid, in_force)
    plan.considered.extend(refused)
    return plan, offers


def hour_and_next(fed: Federation, req: ServingRequest, model: ServedModel, warm: dict[str, bool], when: float,
                  cuts: dict[str, dict], step_s: float | None = None, family: str | None = None,
                  next_tps: float | None = None) -> tuple[TrafficPlan, list[CloudOffer], dict[str, int]]:
    """This hour's plan, and the replicas to run through it: this hour's, and where the next hour's forecast
    (``next_tps``) is higher, as many as the next hour's plan (its prices) wants on each cloud. A replica takes
    minutes to come up, so it starts in the hour before it is needed; one the forecast no longer needs is taken
    down by the next run, after draining. Shares stay this hour's."""
    plan, offers = plan_hour(fed, req, model, warm, when, cuts, step_s=step_s, family=family)
    replicas = dict(plan.replicas)
    if next_tps is not None and next_tps > (req.tokens_per_s or 0.0):
        try:
            ahead, _ = plan_hour(fed, replace(req, tokens_per_s=next_tps), model, warm, when + 3600, cuts,
                                 step_s=step_s, family=family)
        except ServingPlacementError:  # no cloud can serve the next hour yet (its prices not published): this hour's
            return plan, offers, replicas
        replicas = sized_ahead(replicas, ahead.replicas)
    return plan, offers, replicas


def decide_hour(fed: Federation, req: ServingRequest, spec: ServeSpec, version: dict, when: float, name: str,
                override: float | None = None, log: Callable[[str], None] = print) -> dict:
    """The hour from ``when``, decided as the hourly run decides it, and kept in the home store as ``name``: the
    demand (the override, else the forecast from the tokens the replicas served), a local replica's measured time
    per token, the plan over the clouds where the model is warm, with the grid cuts in force."""
    home = open_store(fed.local_cloud, req.tenant)
    weights = read_blob(home, req.tenant, needed(spec)[0])
    model = served_model(weights, req.devices_per_replica, name=req.model)
    step_s = local_step_s(fed, spec, weights, req.mix())
    fleet = Fleet(req.tenant, spec.name)
    tokens_per_s, demand = expected_tokens_per_s(Demand(home, req.tenant, spec.name), fleet.token_counts(),
                                                 time.time(), when, override)
    req = replace(req, tokens_per_s=tokens_per_s)
    log(f"demand this hour: {demand['why']}")
    log(f"a local replica generates a token in {step_s * 1000:.2f} ms (measured here)")
    cuts = fleet.cuts()
    plan, offers, replicas = hour_and_next(fed, req, model, warm_clouds(fed, spec, req.chosen_clouds(fed)), when,
                                           cuts, step_s, spec.family, demand["next_hour_tokens_per_s"])
    log(plan.explain())
    record = {**decision_record(req, spec, version, plan, offers, when, cuts), "demand": demand,
              "replicas": replicas, "replicas_this_hour": plan.replicas}
    if replicas != plan.replicas:
        log(f"replicas {replicas}: up and warm now for the next hour's {demand['next_hour_tokens_per_s']:.1f} tokens/s "
            f"(this hour needs {plan.replicas})")
    home.put(f"{req.tenant}/serving/{spec.name}/decisions/{name}.json", json.dumps(record, indent=2).encode())
    return record


def decision_record(req: ServingRequest, spec: ServeSpec, version: Version | dict, plan: TrafficPlan,
                    offers: list[CloudOffer], when: float, cuts: dict[str, dict]) -> dict:
    """Everything a decision was made from and what it decided, as JSON: for the store, MLflow and a grid request."""
    v = version if isinstance(version, dict) else {"name": version.name, "version": version.version,
                                                    "run_id": version.run_id}
    return {"decided_at": time.time(), "reason": "placement hour", "hour": when, "request": asdict(req),
            "spec": spec.__dict__, "version": v, "offers": [offer_to_dict(o) for o in offers], "cuts": cuts,
            "usd_per_1k_tokens": {o.name: o.price_per_token * 1000 for o in offers}, **plan_fields(plan)}


def plan_fields(plan: TrafficPlan) -> dict:
    """What a plan decided, as JSON."""
    return {"shares": plan.shares, "tokens_per_s": plan.tokens_per_s, "replicas": plan.replicas,
            "utilisation": plan.utilisation, "unserved_tps": plan.unserved_tps,
            "latency_goal_met": plan.latency_goal_met, "cost_usd_per_hour": plan.cost_usd_per_s * 3600,
            "sheds": [asdict(s) for s in plan.sheds], "preheat_first": plan.preheat_first,
            "considered": [asdict(c) for c in plan.considered]}


def grid_cuts(cuts: dict[str, dict], offers: list[CloudOffer]) -> list[GridCut]:
    """The grid cuts in force (as the fleet keeps them) on clouds that have an offer."""
    names = {o.name for o in offers}
    return [GridCut(c, cut["reduce_pct"], cut["within_s"]) for c, cut in cuts.items() if c in names]


def replan(record: dict, cuts: dict[str, dict], in_force: dict[str, float] | None) -> TrafficPlan:
    """The plan of a recorded decision's hour again, with other grid cuts (a grid request starting or ending)."""
    req = ServingRequest(**{**record["request"], "clouds": tuple(record["request"]["clouds"]),
                            "jurisdictions": tuple(record["request"]["jurisdictions"])})
    offers = [offer_from_dict(o) for o in record["offers"]]
    grid = grid_cuts(cuts, offers)
    return place_traffic(req.goal(), offers, grid, in_force)
