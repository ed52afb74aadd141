"""The queue as people see it: one row per entry for the CLI, the Airflow page and its API.

A row says where the run stands (position while it waits), what it asked
for, when it is expected to start and where, why, and its deadline. The same
dict feeds ``crosscloud queue --json`` and the page, so both say the same.
"""

from __future__ import annotations

import json
import math
import time

from crosscloud.scheduler.service import Status, expected_start


def _when(t: float | None) -> str:
    if t is None or math.isinf(t):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def status_dict(s: Status, now: float) -> dict:
    """One entry as the CLI and the page show it."""
    d, row = s.decision, s.row
    request = json.loads(row.request)
    asked = (f"{_devices(request)} it had" if request.get("parts") else
             f"{request['spread']['per_cloud']} per cloud" if request.get("spread") else f"{request['devices']} in all")
    start = row.started_at if row.state == "running" else expected_start(s, now) if d else math.inf
    return {
        "tenant": row.tenant, "run_id": row.run_id, "state": row.state, "position": s.position,
        "priority": row.priority, "devices": asked, "clouds": request.get("clouds") or "any",
        "decision": d.kind if d else "undecided", "where": ", ".join(f"{n} x {a} on {c}" for c, a, n in d.parts) if d else "",
        "expected_start": None if start is None or math.isinf(start) else start, "reason": d.reason if d else "not decided yet",
        "submitted_at": row.submitted_at, "waited_s": (row.started_at or now) - row.submitted_at,
        "deadline": row.deadline, "deferrable": row.deferrable, "objective": row.objective,
        "estimated_device_hours": row.runtime_s * _devices(request) / 3600,
    }


def _devices(request: dict) -> int:
    if request.get("parts"):  # a paused run asks for the devices it trained on
        return sum(n for _, _, n in request["parts"])
    spread = request.get("spread")
    return spread["per_cloud"] * max(1, len(request.get("clouds") or [])) if spread else request["devices"]


def format_queue(rows: list[Status], now: float) -> str:
    if not rows:
        return "the queue is empty"
    lines = [f"{'pos':>4}  {'tenant':<10}{'run':<28}{'state':<9}{'prio':>5}  {'devices':<14}{'decision':<9}"
             f"{'expected start':<22}{'deadline':<22}reason"]
    for s in rows:
        r = status_dict(s, now)
        lines.append(f"{r['position'] or '':>4}  {r['tenant']:<10}{r['run_id'][:27]:<28}{r['state']:<9}{r['priority']:>5}  "
                     f"{r['devices']:<14}{r['decision']:<9}{_when(r['expected_start']):<22}{_when(r['deadline']):<22}"
                     f"{r['reason'][:120]}")
    return "\n".join(lines)


def format_explain(s: Status, now: float) -> str:
    r = status_dict(s, now)
    lines = [f"run {r['run_id']} of {r['tenant']}: {r['state']}" + (f", position {r['position']}" if r['position'] else ""),
             f"  asked for {r['devices']} on {r['clouds']}, priority {r['priority']}, "
             f"about {r['estimated_device_hours']:.2f} device-hours",
             f"  submitted {_when(r['submitted_at'])}, waited {r['waited_s'] / 60:.1f} min",
             f"  decision: {r['decision']}" + (f" ({r['where']})" if r['where'] else ""),
             f"  expected start: {_when(r['expected_start'])}; deadline: {_when(r['deadline'])}"
             + (f", deferrable by {r['objective']}" if r['deferrable'] else ""),
             f"  why: {r['reason']}"]
    if s.row.end_reason:
        lines.append(f"  ended: {s.row.end_reason}")
    return "\n".join(lines)
