"""What an operator sees of a served model: per cloud, its share, replicas, tokens/s, cost per 1k tokens, latency.

Planned figures (share, cost per 1k tokens) come from the decision in force;
served ones (tokens/s, p50/p99, the share actually served) from the replicas'
own meters; replicas and their health from the router. The CLI
(``crosscloud serve status``) and the Airflow page show the same rows.
"""

from __future__ import annotations

from datetime import datetime, timezone

from crosscloud.ledger import Ledger
from crosscloud.serving.fleet import Fleet
from crosscloud.serving.router import Router


def fleets(tenants: list[str] | None = None, ledger: Ledger | None = None) -> list[Fleet]:
    """Every served model the deployment's ledger knows, of the given tenants (None: all)."""
    ledger = ledger or Ledger()
    return [Fleet(tenant, name, ledger=ledger) for tenant, name in ledger.fleets.names(tenants)]


def _replicas_by_cloud(router: Router | None) -> dict[str, tuple[int, int]]:
    """(healthy, total) replicas per cloud, as the router (None: not running) sees them."""
    out: dict[str, tuple[int, int]] = {}
    for row in (router.status().values() if router else []):
        healthy, total = out.get(row["cloud"], (0, 0))
        out[row["cloud"]] = (healthy + int(row["healthy"] and row["state"] == "ready"), total + 1)
    return out


def fleet_status(fleet: Fleet) -> dict:
    """One served model's rows (see the module docstring)."""
    decision, served, router = fleet.decision or {}, fleet.served(), fleet.router()
    replicas, cuts = _replicas_by_cloud(router), fleet.cuts()
    rate = {c: sum(r.get("tokens_per_s") or 0.0 for r in rows) for c, rows in served.items()}
    total = sum(rate.values())
    clouds = sorted(set(decision.get("shares", {})) | set(served) | set(replicas))
    rows = []
    for c in clouds:
        p50 = [r["p50_s"] for r in served.get(c, []) if r.get("p50_s") is not None]
        p99 = [r["p99_s"] for r in served.get(c, []) if r.get("p99_s") is not None]
        rows.append({"cloud": c, "planned_share": decision.get("shares", {}).get(c, 0.0),
                     "served_share": rate.get(c, 0.0) / total if total > 0 else 0.0,
                     "replicas": replicas.get(c, (0, 0))[0], "replicas_total": replicas.get(c, (0, 0))[1],
                     "tokens_per_s": rate.get(c, 0.0),
                     "usd_per_1k_tokens": decision.get("usd_per_1k_tokens", {}).get(c),
                     "p50_ms": 1000 * sorted(p50)[len(p50) // 2] if p50 else None,
                     "p99_ms": 1000 * max(p99) if p99 else None,
                     "grid_cut_pct": cuts[c]["reduce_pct"] if c in cuts else None})
    return {"tenant": fleet.tenant, "model": fleet.name, "router": router.url if router else None,
            "version": decision.get("version"), "decided_at": decision.get("decided_at"),
            "latency_goal_met": decision.get("latency_goal_met"), "clouds": rows}


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_status(status: dict) -> str:
    """The rows as a text table, with the router and the version served above them."""
    when = (datetime.fromtimestamp(status["decided_at"], timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            if status.get("decided_at") else "never")
    v = status.get("version") or {}
    head = (f"{status['tenant']}/{status['model']}: router {status['router'] or 'not running'}; "
            f"version {v.get('name', '?')}/{v.get('version', '?')}; decided {when}")
    lines = [head, f"{'cloud':<14}{'share':>7}{'served':>8}{'replicas':>10}{'tok/s':>9}{'$/1k tok':>11}"
                   f"{'p50 ms':>8}{'p99 ms':>8}  grid"]
    for r in status["clouds"]:
        grid = "" if r["grid_cut_pct"] is None else f"-{r['grid_cut_pct']:g}%"
        lines.append(f"{r['cloud']:<14}{r['planned_share']:>7.2f}{r['served_share']:>8.2f}"
                     f"{r['replicas']:>5}/{r['replicas_total']:<4}{r['tokens_per_s']:>9.1f}"
                     f"{_cell(r['usd_per_1k_tokens'], '.6f'):>11}{_cell(r['p50_ms'], '.0f'):>8}"
                     f"{_cell(r['p99_ms'], '.0f'):>8}  {grid}")
    return "\n".join(lines)
