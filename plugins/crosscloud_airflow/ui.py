"""The crosscloud page of the Airflow UI: the global compute view, and each run's plan and rounds.

A FastAPI app that the api-server mounts at ``/crosscloud`` (``plugin.py``),
shown inside the Airflow UI as external views: an entry of the navigation and
a tab on every DAG run. Each route depends on Airflow's own authentication
and authorization (the UI's JWT cookie or a bearer token, and read access to
the DAG's runs): a request without them gets 401/403 and no data. Past that,
a user sees the runs, queue entries, reservations, quota and served models of their own tenants only
(``tenancy.py``: the Airflow teams the auth manager puts them in; an
administrator is in all); pools' totals and use stay global, capacity being
no tenant's secret. The HTML is rendered on the server, fresh from the engine
on each request (``pool.inventory.collect``, ``tracking.run_report``); the page
needs no JavaScript. ``/api/inventory`` is the same view as JSON, for
``crosscloud inventory --airflow``.
"""

from __future__ import annotations

import os
import time
from html import escape
from urllib.parse import quote

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from crosscloud_airflow.tenancy import require_tenant, visible_tenants

TRAINING_DAG = "cross_cloud_training"
RECENT_RUNS = 10  # per tenant on the global view
PARTS = (("compute", "#4e79a7"), ("communication", "#f28e2b"), ("waiting", "#bab0ac"))

app = FastAPI(title="crosscloud", description="Global compute view and cross-cloud runs", docs_url=None, redoc_url=None)

STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#1a202c}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.6rem}
table{border-collapse:collapse;margin:.4rem 0}td,th{border:1px solid #cbd5e0;padding:3px 8px;text-align:left;font-size:.85rem}
th{background:#edf2f7}td.n{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#718096}
.lane{display:flex;align-items:center;margin:3px 0}.lane .name{width:110px;font-size:.85rem}
.bar{display:flex;height:20px}.seg{height:20px}.round{display:flex;margin-right:2px;outline:1px solid #fff}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
.ok{color:#2f855a}.bad{color:#c53030}.note{background:#fefcbf;padding:6px 10px;max-width:60rem}
"""


def _fmt(value, spec: str = ".2f", unit: str = "") -> str:
    return "unknown" if value is None else f"{value:{spec}}{unit}"


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table; cells are already escaped."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td class='n'>{c}</td>" if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
                        f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _mlflow_link(tracking: dict) -> str:
    base = os.environ.get("CROSSCLOUD_MLFLOW_UI_URL", "http://localhost:5000").rstrip("/")
    if not tracking:
        return "<span class='muted'>not tracked in MLflow</span>"
    url = f"{base}/#/experiments/{tracking['experiment_id']}/runs/{tracking['parent_run_id']}"
    return f"<a id='mlflow-link' href='{escape(url)}' target='_blank' rel='noopener'>MLflow run {escape(tracking['parent_run_id'])}</a>"


def _shown_inventory(fed, ledger, shown: list[str]):
    """The inventory with only the ``shown`` tenants' section; pools' totals and use stay global."""
    from crosscloud.pool.inventory import collect

    inv = collect(fed, ledger)
    inv.tenants = [t for t in inv.tenants if t.name in shown]
    return inv


def _pool_rows(inv, holding: dict[str, set[str]]) -> list[list[str]]:
    rows = []
    for c in inv.clouds:
        for i, p in enumerate(c.pools):
            head = [escape(c.name), escape(c.role), escape(c.jurisdiction), escape(c.state),
                    escape(c.health) + (f"<br><span class='bad'>{escape(c.refuses)}</span>" if c.refuses else "")]
            runs = ", ".join(escape(x) for x in sorted(holding.get(c.name, ()))) or "<span class='muted'>none</span>"
            rows.append((head if i == 0 else [""] * 5) + [
                escape(p.accelerator), str(p.total), str(p.in_use), str(p.free), f"{p.price_per_device_hour:.2f}",
                _fmt(p.electricity_usd_mwh, ".1f") if p.electricity_usd_mwh is not None
                else f"<span title='{escape(p.electricity_note)}'>unknown</span>",  # why, on hover
                _fmt(p.effective_price_per_device_hour, ".4f"), runs if i == 0 else ""])
    return rows


def _recent_runs(fed, shown: list[str]) -> list[list[str]]:
    from crosscloud.tracking.run_report import list_runs, load_run

    from crosscloud.store.base import StoreError
    from crosscloud.store.credentials import CredentialsError

    recent = []
    for tenant in shown:
        try:
            runs = list_runs(fed, tenant)[:RECENT_RUNS]
        except (StoreError, CredentialsError) as exc:  # one tenant's store out of reach: the page still shows the rest
            recent.append([f"<span class='bad'>cannot list: {escape(str(exc))}</span>", escape(tenant), *[""] * 6])
            continue
        for _, run_id in runs:
            v = load_run(fed, tenant, run_id)
            m = v.metrics
            recent.append([f"<a href='runs/{TRAINING_DAG}/{quote(run_id, safe='')}'>{escape(run_id)}</a>", escape(tenant), escape(v.mode),
                           ", ".join(escape(c["name"]) for c in v.clouds), escape(v.state), f"{v.rounds_done}/{v.rounds}",
                           _fmt(m.get("final_eval_loss"), ".4f"), _fmt(m.get("iteration_time_gap_pct"), "+.1f", " %")])
    return recent


def _viewer(user, shown: list[str], note: str) -> str:
    """Who the page is for and which tenants it shows them, or why none."""
    if note:
        return f"<p class='note' id='no-tenant'>{escape(note)}</p>"
    return (f"<p class='muted'>signed in as {escape(user.get_name())}: tenants shown "
            f"<b id='tenants-shown'>{escape(', '.join(shown))}</b></p>")


def _sources():
    """The federation and the reservation ledger, read afresh for each request.

    Stores and the ledger are reached as the tasks reach them: through Airflow Connections.
    """
    from crosscloud.core.federation import load_federation
    from crosscloud.ledger import Ledger
    from crosscloud_airflow.connections import use_airflow_connections

    use_airflow_connections()
    return load_federation(), Ledger()


def serving_section(statuses: list[dict]) -> str:
    """Each served model's clouds: planned and served share, replicas, tokens/s, cost per 1k tokens, p50/p99."""
    if not statuses:
        return "<p class='muted'>no served model (the inference_placement DAG serves one)</p>"
    rows = []
    for st in statuses:
        v = st.get("version") or {}
        name = (f"{escape(st['tenant'])}/{escape(st['model'])} v{escape(str(v.get('version', '?')))}"
                f"<br><span class='muted'>{escape(st['router'] or 'router not running')}</span>")
        for r in st["clouds"]:
            rows.append([name, escape(r["cloud"]), _fmt(r["planned_share"]), _fmt(r["served_share"]),
                         f"{r['replicas']}/{r['replicas_total']}", _fmt(r["tokens_per_s"], ".1f"),
                         _fmt(r["usd_per_1k_tokens"], ".6f"), _fmt(r["p50_ms"], ".0f"), _fmt(r["p99_ms"], ".0f"),
                         "" if r["grid_cut_pct"] is None else f"-{r['grid_cut_pct']:g}%"])
    return "<div id='serving'>" + _table(["served model", "cloud", "share", "served share", "replicas ready", "tokens/s",
                                          "USD / 1k tokens", "p50 ms", "p99 ms", "grid request"], rows,
                                         numeric={2, 3, 5, 6, 7, 8}) + "</div>"


def _compute_view(user) -> str:
    fed, ledger = _sources()
    shown, note = visible_tenants(user, [t.name for t in fed.tenants])
    inv = _shown_inventory(fed, ledger, shown)
    holding: dict[str, set[str]] = {}
    for r in ledger.active():
        if r.tenant in shown:
            holding.setdefault(r.cloud, set()).add(f"{r.run_id} ({r.tenant})")
    hours = sorted({p.electricity_hour for c in inv.clouds for p in c.pools if p.electricity_hour})
    tenants = [[escape(t.name), ", ".join(f"{escape(cloud)} {t.used.get(cloud, 0)}/{q}" for cloud, q in t.quota.items()),
                ", ".join(escape(r) for r in t.runs) or "<span class='muted'>none</span>"] for t in inv.tenants]
    recent = _recent_runs(fed, shown)
    return (
        f"<h1>crosscloud: global compute</h1><p class='muted'>federation <b id='federation'>{escape(inv.federation)}</b>, "
        f"{len(inv.clouds)} clouds, as of {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(inv.generated_at))}</p>"
        + _viewer(user, shown, note)
        + "<h2>Clouds and accelerator pools</h2>"
        + _table(["cloud", "role", "jurisdiction", "state", "health", "accelerator", "total", "in use", "free", "price/device-h",
                  "electricity USD/MWh", "effective price/device-h", "runs on it"], _pool_rows(inv, holding),
                 numeric={6, 7, 8, 9, 10, 11})
        + (f"<p class='muted'>electricity: grid price at {escape(', '.join(hours))} UTC (now mapped onto the data's year); "
           "effective price = rental + power x electricity price x PUE</p>" if hours else "")
        + "<h2>Tenants: devices used / quota</h2>"
        + (_table(["tenant", "used / quota per cloud", "runs holding devices"], tenants) if tenants
           else "<p class='muted'>no tenant shown</p>")
        + "<h2>Queue</h2>" + queue_section(queue_rows(fed, ledger, shown))
        + "<h2>Recent runs</h2>"
        + (_table(["run", "tenant", "mode", "clouds", "state", "rounds", "final eval loss", "iteration-time gap"], recent, numeric={5, 6, 7})
           if recent else "<p class='muted'>no runs yet</p>")
        + "<h2>Serving: traffic per cloud</h2>" + serving_section(_serving(shown))
    )


def queue_rows(fed, ledger, shown: list[str]) -> list[dict]:
    """The queue's entries of the ``shown`` tenants, waiting ones in the order of the next pass, then running ones."""
    from crosscloud.scheduler.service import Queue
    from crosscloud.scheduler.view import status_dict

    now = time.time()
    return [status_dict(s, now) for s in Queue(fed, ledger).listing() if s.row.tenant in shown]


def queue_section(rows: list[dict]) -> str:
    """Each entry: position, tenant, run, state, priority, devices, decision, expected start, deadline, reason."""
    if not rows:
        return "<p class='muted' id='queue-empty'>no run of your tenants waits or runs</p>"

    def when(t):
        return "-" if t is None else time.strftime("%m-%d %H:%M UTC", time.gmtime(t))

    body = [[str(r["position"] or ""), escape(r["tenant"]), escape(r["run_id"]), escape(r["state"]), str(r["priority"]),
             escape(r["devices"]), escape(r["decision"]) + (f"<br><span class='muted'>{escape(r['where'])}</span>" if r["where"] else ""),
             when(r["expected_start"]), f"{r['waited_s'] / 60:.1f}", when(r["deadline"]), escape(r["reason"][:300])]
            for r in rows]
    return "<div id='queue'>" + _table(["position", "tenant", "run", "state", "priority", "devices", "decision",
                                        "expected start", "waited min", "deadline", "reason"], body, numeric={0, 4, 8}) + "</div>"


def _serving(shown: list[str]) -> list[dict]:
    from crosscloud.serving.status import fleet_status, fleets

    return [fleet_status(f) for f in fleets(shown)]


def _timeline(view) -> str:
    """Each cloud a lane, its rounds side by side, each round split into compute / communication / waiting."""
    longest = max((sum(s.total_s for s in slices) for slices in view.timeline.values()), default=0.0) or 1.0
    lanes = []
    for cloud, slices in view.timeline.items():
        blocks = []
        for s in slices:
            segs = "".join(
                f"<div class='seg' style='width:{600 * sec / longest:.1f}px;background:{color}' title='{part} {sec:.2f} s'></div>"
                for (part, color), sec in zip(PARTS, (s.compute_s, s.comm_s, s.wait_s)))
            blocks.append(f"<div class='round' title='round {s.round}: {s.total_s:.2f} s'>{segs}</div>")
        lanes.append(f"<div class='lane'><div class='name'>{escape(cloud)}</div><div class='bar'>{''.join(blocks)}</div></div>")
    legend = "<div class='legend'>" + "".join(f"<span style='background:{c}'></span>{p}" for p, c in PARTS) + "</div>"
    rows = [[escape(cloud), str(s.round), f"{s.compute_s:.2f}", f"{s.comm_s:.2f}", f"{s.wait_s:.2f}", f"{s.total_s:.2f}"]
            for cloud, slices in view.timeline.items() for s in slices]
    return (legend + "<div id='timeline'>" + "".join(lanes) + "</div>"
            + _table(["cloud", "round", "compute s", "communication s", "waiting s", "total s"], rows, numeric={1, 2, 3, 4, 5}))


def _run_view(user, dag_id: str, run_id: str) -> str:
    from crosscloud.tracking.run_report import find_tenant, load_run

    fed, _ = _sources()
    tenant = find_tenant(fed, run_id)
    if tenant is None:
        raise HTTPException(404, f"DAG run {run_id} of {dag_id} has no crosscloud plan (it was not admitted, or is not a training run)")
    require_tenant(user, tenant)
    v = load_run(fed, tenant, run_id)
    m, b = v.metrics, v.baseline
    batch = sum(c["share"] for c in v.clouds)
    plan = _table(["cloud", "accelerator", "devices", "share of the global batch", "access"],
                  [[escape(c["name"]), escape(c["accelerator"]), str(c["devices"]), f"{c['share']}/{batch}", escape(c["method"])]
                   for c in v.clouds], numeric={2})
    why = _table(["cloud / pool", "verdict", "why"],
                 [[escape(f"{c['cloud']}/{c['accelerator']}"), "<b class='ok'>chosen</b>" if c["chosen"] else "not chosen",
                   escape(c["reason"])] for c in v.candidates])
    numbers = [
        ["rounds", f"<span id='rounds-done'>{v.rounds_done}</span>/{v.rounds} ({escape(v.state)})"],
        ["eval loss", f"{_fmt(m.get('eval_loss_start'), '.4f')} at start -> <span id='final-eval-loss'>"
                      f"{_fmt(m.get('final_eval_loss', v.eval_loss[-1][1] if v.eval_loss else None), '.4f')}</span>"],
        ["iteration time", _fmt(m["iteration_time_s"] * 1000 if m.get("iteration_time_s") else None, ".1f", " ms/step")],
        ["single-cluster baseline", f"{_fmt(b['iteration_time_s'] * 1000, '.1f', ' ms/step')} (run {escape(b['run_id'])}, {escape(b['source'])})"
                                    if b else "<span class='muted'>none</span>"],
        ["iteration-time gap", f"<span id='gap'>{_fmt(m.get('iteration_time_gap_pct'), '+.2f', ' %')}</span>"],
        ["cost / energy", f"{_fmt(m.get('cost'), '.4f')} / {_fmt(m.get('energy_kwh'), '.5f', ' kWh')}"],
        ["MLflow", _mlflow_link(v.tracking)],
    ]
    return (
        f"<h1>run <span id='run-id'>{escape(run_id)}</span></h1>"
        f"<p class='muted'>DAG {escape(dag_id)}, tenant {escape(tenant)}, mode {escape(v.mode)} - "
        f"<a href='../../'>global compute view</a></p>"
        + _table(["figure", "value"], numbers)
        + "<h2>Plan: clouds and shares</h2>" + plan
        + "<h2>Why these clouds</h2>" + why
        + "<h2>Rounds per cloud: compute / communication / waiting</h2>" + _timeline(v)
    )


@app.get("/", response_class=HTMLResponse,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=TRAINING_DAG))])
def compute_page(user: GetUserDep) -> HTMLResponse:
    """The global compute view: clouds, pools, prices; the user's tenants and their runs."""
    return _page("crosscloud: global compute", _compute_view(user))


@app.get("/api/inventory",
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=TRAINING_DAG))])
def inventory_api(user: GetUserDep) -> dict:
    """The inventory as the page shows it to this user, as JSON (``crosscloud inventory --airflow``)."""
    fed, ledger = _sources()
    shown, note = visible_tenants(user, [t.name for t in fed.tenants])
    return {**_shown_inventory(fed, ledger, shown).to_dict(),
            "shown_to": {"user": user.get_name(), "tenants": shown, "note": note}}


@app.get("/api/queue",
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=TRAINING_DAG))])
def queue_api(user: GetUserDep) -> dict:
    """The queue as the page shows it to this user: only their tenants' entries (Kueue's visibility API, per tenant)."""
    fed, ledger = _sources()
    shown, note = visible_tenants(user, [t.name for t in fed.tenants])
    return {"entries": queue_rows(fed, ledger, shown), "shown_to": {"user": user.get_name(), "tenants": shown, "note": note}}


@app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])
def run_page(dag_id: str, run_id: str, user: GetUserDep) -> HTMLResponse:
    """One DAG run of the user's tenants: plan, why each cloud, rounds per cloud, the gap, the MLflow run."""
    return _page(f"crosscloud run {run_id}", _run_view(user, dag_id, run_id))
