"""A grid request to a cloud, answered by the served models on it: traffic moves away, replicas go down.

Why re-plan and not just drain: the request asks for a cut of X%, not for the
cloud to go dark, so the hour's plan is solved again from the recorded decision
with the cut as a bound (``traffic.shed_limit``): the cloud keeps the traffic
and replicas whose modelled draw stays X% under the draw before, the rest moves
to the other clouds by price. Each served model sheds X% of its own draw on
the cloud, so together they shed X% of serving's draw there.

The check (``verify``) measures, not assumes: the cloud's replicas count the
tokens they serve, and the power model turns the tokens per second they served
before the request and after it held into watts (busy share of the running
replicas' devices, the rest idle, x PUE). The cut holds when that modelled
draw fell by X% within the time allowed. When the request ends, ``restore``
re-plans without it and the traffic returns.
"""

from __future__ import annotations

import time

from crosscloud.serving.fleet import Fleet
from crosscloud.serving.meter import RECENT_S
from crosscloud.serving.offers import offer_from_dict
from crosscloud.serving.placement import plan_fields, replan
from crosscloud.serving.traffic import TrafficPlan, power_w


def _served_tokens(fleet: Fleet, cloud: str) -> tuple[float, float]:
    """(tokens the cloud's replicas served in all, their tokens/s over the last ``RECENT_S``) now.

    The recent rate, not the minute's: a minute that began before the traffic
    did would understate the draw before a cut and hide the shed.
    """
    rows = fleet.served().get(cloud, [])
    return float(sum(r.get("tokens") or 0 for r in rows)), float(sum(r.get("recent_tokens_per_s") or 0.0 for r in rows))


def _apply(fleet: Fleet, plan: TrafficPlan, record: dict, reason: str) -> dict:
    """Apply a re-plan and make it the decision in force."""
    spec = fleet.spec
    allowed = frozenset(record["request"]["jurisdictions"]) or None
    applied = fleet.apply(spec, plan.shares, plan.replicas, allowed)
    new = {**record, **plan_fields(plan), "decided_at": time.time(), "reason": reason, "cuts": fleet.cuts()}
    fleet.save_decision(new)
    return applied


def serving_on(cloud: str, fleets: list[Fleet]) -> list[Fleet]:
    """The fleets that serve on ``cloud`` now: a router running and a replica of theirs running there."""
    return [f for f in fleets if f.decision and f.router() is not None and any(r.cloud == cloud for r in f.replicas())]


def shed(fleet: Fleet, cloud: str, reduce_pct: float, within_s: float, duration_s: float) -> dict:
    """Cut the fleet's draw on ``cloud`` by ``reduce_pct`` until the request ends; what it did and from what."""
    record = fleet.decision
    total_before, rate_before = _served_tokens(fleet, cloud)
    # kept past the request's end by the time to answer it: restore (a teardown) is what ends it
    cut = {"reduce_pct": reduce_pct, "within_s": within_s, "until": time.time() + duration_s + within_s}
    fleet.set_cut(cloud, cut)
    plan = replan(record, {**fleet.cuts(), cloud: cut}, in_force=record["tokens_per_s"])
    issued = time.time()
    applied = _apply(fleet, plan, record, f"grid request -{reduce_pct:g}% on {cloud}")
    modelled = next(s for s in plan.sheds if s.cloud == cloud)
    return {"tenant": fleet.tenant, "model": fleet.name, "cloud": cloud, "reduce_pct": reduce_pct,
            "issued_at": issued, "applied_at": time.time(), "replicas_before": record["replicas"].get(cloud, 0),
            "replicas_after": plan.replicas.get(cloud, 0), "share_before": record["shares"].get(cloud, 0.0),
            "share_after": plan.shares.get(cloud, 0.0), "modelled_shed_pct": modelled.achieved_pct,
            "tokens_per_s_before": rate_before, "tokens_before": total_before, "stopped": applied["stopped"]}


def verify(fleet: Fleet, answer: dict, within_s: float, window_s: float = RECENT_S) -> dict:
    """Measure the cloud's served tokens/s once the cut applied; the modelled draw before and after, and if it held.

    The draw before is the power model at the tokens/s the replicas served in the
    ``RECENT_S`` before the request; after, at the tokens/s they served over ``window_s``
    once the change applied (in-flight requests finished on the old replicas).
    """
    cloud = answer["cloud"]
    offer = offer_from_dict(next(o for o in fleet.decision["offers"] if o["name"] == cloud))
    start_total, _ = _served_tokens(fleet, cloud)
    t0 = time.monotonic()
    time.sleep(window_s)
    end_total, _ = _served_tokens(fleet, cloud)
    rate_after = max(0.0, end_total - start_total) / (time.monotonic() - t0)
    before = power_w(offer, answer["replicas_before"], answer["tokens_per_s_before"])
    after = power_w(offer, answer["replicas_after"], rate_after)
    shed_pct = 100 * (1 - after / before) if before > 0 else 100.0
    time_to_shed = answer["applied_at"] - answer["issued_at"]
    return {**answer, "tokens_per_s_after": rate_after, "power_before_w": before, "power_after_w": after,
            "shed_pct": shed_pct, "time_to_shed_s": time_to_shed,
            "held": shed_pct >= answer["reduce_pct"] - 1e-9 and time_to_shed <= within_s}


def restore(fleet: Fleet, cloud: str) -> dict:
    """The request ended: re-plan without its cut; the cloud's traffic and replicas come back."""
    fleet.set_cut(cloud, None)
    record = fleet.decision
    plan = replan(record, fleet.cuts(), in_force=None)
    applied = _apply(fleet, plan, record, f"grid request on {cloud} ended")
    return {"tenant": fleet.tenant, "model": fleet.name, "cloud": cloud, "share": plan.shares.get(cloud, 0.0),
            "replicas": plan.replicas.get(cloud, 0), "started": applied["started"]}


def shed_all(cloud: str, reduce_pct: float, within_s: float, duration_s: float) -> list[dict]:
    """Every served model with replicas on ``cloud`` sheds; each change is logged as a decision in MLflow."""
    from crosscloud.serving.status import fleets
    from crosscloud.tracking.serving_hours import log_decision

    answers = []
    for fleet in serving_on(cloud, fleets()):
        answers.append(shed(fleet, cloud, reduce_pct, within_s, duration_s))
        record = fleet.decision
        log_decision(record, record["reason"])
    return answers


def verify_all(answers: list[dict], within_s: float, window_s: float = RECENT_S) -> list[dict]:
    return [verify(Fleet(a["tenant"], a["model"]), a, within_s, window_s) for a in answers]


def restore_all(answers: list[dict]) -> list[dict]:
    """Give every fleet that shed its traffic back; each change is logged as a decision in MLflow."""
    from crosscloud.tracking.serving_hours import log_decision

    out = []
    for a in answers:
        fleet = Fleet(a["tenant"], a["model"])
        out.append(restore(fleet, a["cloud"]))
        record = fleet.decision
        log_decision(record, record["reason"])
    return out
