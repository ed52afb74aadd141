"""The figures every finished run logs to MLflow (``plots/`` artifacts of its parent run).

- ``eval_loss_vs_tokens.png``: the run's eval loss against tokens trained, and
  its single-cluster baseline's (the newest finished run with the same
  ``crosscloud.baseline_key`` tag), so the two line up without opening both;
- ``round_breakdown.png``: each cloud's rounds as a timeline split into
  compute, communication and waiting;
- ``placement_vs_price.png``: each planned cloud's electricity price over the
  day the run trained, with the hours it trained marked (only where the
  clouds have a ``grid:`` and the feed has those hours).
Figures are drawn with matplotlib's Agg backend: no display is needed.
"""

from __future__ import annotations

from datetime import datetime, timezone

from crosscloud.core.federation import Federation
from crosscloud.energy.prices import CsvFeed, ElectricityError, map_to_data_year
from crosscloud.tracking.run_report import RunView

COLORS = {"compute": "#4e79a7", "communication": "#f28e2b", "waiting": "#bab0ac"}


def _figure(width: float = 7.0, height: float = 4.0):
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure  # a Figure without pyplot holds no global state

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def loss_vs_tokens(run: RunView, baseline: tuple[str, int, list[float]] | None):
    """Eval loss against tokens trained; ``baseline`` is (label, tokens per round, [(round, loss)])."""
    fig, ax = _figure()
    start = run.metrics.get("eval_loss_start")
    curves = [(f"{run.run_id} ({run.mode})", run.tokens_per_round, run.eval_loss)]
    if baseline:
        curves.append(baseline)
    for label, per_round, losses in curves:
        xs = [per_round * (r + 1) for r, _ in losses]
        ys = [loss for _, loss in losses]
        if start is not None:  # both runs start from the same seed's initial model
            xs, ys = [0, *xs], [start, *ys]
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel("tokens trained")
    ax.set_ylabel("eval loss (held-out)")
    ax.set_title("eval loss against tokens" + (": run and its single-cluster baseline" if baseline
                                               else " (no single-cluster baseline with this key recorded)"))
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def round_breakdown(run: RunView):
    """Each cloud a lane; its rounds one after another, each split into compute / communication / waiting."""
    fig, ax = _figure(height=1.8 + 0.6 * len(run.timeline))
    for lane, (cloud, slices) in enumerate(run.timeline.items()):
        t = 0.0
        for s in slices:
            for part, seconds in (("compute", s.compute_s), ("communication", s.comm_s), ("waiting", s.wait_s)):
                ax.barh(lane, seconds, left=t, color=COLORS[part], edgecolor="white", linewidth=0.5,
                        label=part if lane == 0 and s.round == slices[0].round else None)
                t += seconds
    ax.set_yticks(range(len(run.timeline)), list(run.timeline))
    ax.invert_yaxis()  # clouds top to bottom in plan order
    ax.set_xlabel("seconds since round 0 started (each block one round)")
    ax.set_title(f"round-time breakdown per cloud, {run.rounds_done} rounds")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncols=3, fontsize="small")
    return fig


def price_curves(fed: Federation, run: RunView, started_at: float, feed=None) -> dict[str, list[float]]:
    """Each planned cloud's price (USD/MWh) for the 24 data hours from the run's start hour; clouds without data left out."""
    feed = feed or CsvFeed()
    first = map_to_data_year(datetime.fromtimestamp(started_at, timezone.utc), feed.year)
    curves = {}
    for c in run.clouds:
        grid = fed.cloud(c["name"]).grid
        if grid is None:
            continue
        try:
            curves[c["name"]] = feed.prices(grid.region).window(first, 24)
        except ElectricityError:
            continue
    return curves


def placement_vs_price(run: RunView, curves: dict[str, list[float]], started_at: float, ended_at: float):
    """The price curves of the planned clouds, their batch shares in the legend, the hours trained shaded."""
    fig, ax = _figure()
    shares = {c["name"]: c["share"] for c in run.clouds}
    for cloud, prices in curves.items():
        ax.step(range(len(prices)), prices, where="post", label=f"{cloud} (share {shares[cloud]})")
    hours = max((ended_at - started_at) / 3600, 0.05)
    ax.axvspan(0, hours, color="#59a14f", alpha=0.25, label="run trained")
    start = datetime.fromtimestamp(started_at, timezone.utc)
    ax.set_xlabel(f"hours from {start:%Y-%m-%d %H:00} UTC (prices of the same hour of the data year)")
    ax.set_ylabel("electricity price, USD/MWh")
    ax.set_title("placement against the price curve")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=4)
    ax.grid(alpha=0.3)
    return fig


def _baseline_curve(client, experiment_id: str, key: str, own: str) -> tuple[str, int, list[float]] | None:
    """The newest finished single-cluster run with baseline key ``key`` as (label, tokens per round, losses)."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=(f"tags.`crosscloud.mode` = 'single_cluster' and tags.`crosscloud.baseline_key` = '{key}' "
                       "and tags.`crosscloud.level` = 'job' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"],
        max_results=5,
    )
    run = next((r for r in runs if r.info.run_id != own), None)
    if run is None:
        return None
    p = run.data.params
    per_round = int(p["global_batch"]) * int(p["inner_steps"]) * int(p["model.seq_len"])
    losses = [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, "eval_loss"), key=lambda m: m.step)]
    return f"{run.data.tags.get('crosscloud.run_id', run.info.run_name)} (single-cluster baseline)", per_round, losses


def log_plots(client, fed: Federation, run: RunView, baseline_key: str, started_at: float, ended_at: float) -> list[str]:
    """Draw the run's figures and log them to its MLflow parent run; returns the artifact paths logged."""
    parent = run.tracking["parent_run_id"]
    baseline = _baseline_curve(client, run.tracking["experiment_id"], baseline_key, parent)
    figures = {"plots/eval_loss_vs_tokens.png": loss_vs_tokens(run, baseline),
               "plots/round_breakdown.png": round_breakdown(run)}
    curves = price_curves(fed, run, started_at)
    if curves:
        figures["plots/placement_vs_price.png"] = placement_vs_price(run, curves, started_at, ended_at)
    for path, fig in figures.items():
        client.log_figure(parent, fig, path)
    return list(figures)
