"""Inference benchmark: serving traffic placed by electricity price against price-unaware routing, and the offline optimum.

Scenario (defaults; every one is an argument, see ``--help`` and ``docs/serving.md``):

* **Trace**: the Azure LLM inference traces of 2023 (``code`` and ``conv``, one
  hour each, 28,185 requests) from ``$CROSSCLOUD_DATA_DIR/inference``, merged and
  repeated hour by hour (``crosscloud.serving.replay``): ``--peak-per-hour``
  requests (default the trace's own count) at the profile's peak hour, scaled
  by a daily profile (raised cosine, trough ``--trough`` 0.35 of the peak at
  03:00, peak at ``--peak-hour`` 15:00 local time of the users, UTC+``--utc-offset`` 1).
* **Prices**: real hourly prices ``--start`` 2023-07-10 to ``--end`` 2023-07-12
  (72 h) of the clouds' regions (``--regions`` overrides the clouds file's);
  decisions see the day-ahead price (published 12:00 UTC for the next day;
  ``--no-day-ahead``: a seasonal-naive forecast, its lag chosen per region
  on the two weeks before, ``hour_ahead_lags``).
* **Clouds**: ``--clouds`` (``bench/inference_clouds.yaml``): six clouds, one per
  region, with accelerators, devices, PUE and round trip from the users; the
  model (``--params-b`` 70, 4 devices a replica, batch 32) and its rates come
  from ``crosscloud.serving.energy``. Rental: ``--rental`` USD per H100-hour,
  other accelerators priced per unit of throughput.
* **Tenant**: p99 goal ``--p99-goal-s`` (default: the price-unaware policy's
  p99 on the same replay, i.e. the tenant keeps today's latency), residency
  ``--jurisdictions`` (default any), standby ``--min-share`` 0.02.
* **Grid request**: ``--grid CLOUD:PCT:WITHIN_MIN:START_H:HOURS`` (default
  ``auto:10:5:30:2``; ``auto`` = the cloud carrying most crosscloud traffic then).

Policies: price-unaware (by capacity; and nearest cloud), crosscloud (every
hour through ``crosscloud.serving.traffic``), and the offline optimum (LP per
hour, actual prices and demand, the same bounds). ``fraction_of_optimal`` =
(unaware - crosscloud) / (unaware - optimum) on electricity cost; the
reduction and the latency ratio are against price-unaware by capacity.

The live figures (failed requests, p50/p99 of each policy, bytes moved to
warm clouds, time to shed, shed) come from real requests through the real
router to real serving processes on 127.0.0.1 over a time-compressed slice
of the replay (``bench/inference_live.py``; ``--live-*`` arguments). With
``--no-live`` they are MODELLED on the replay: failed = requests beyond a
cloud's capacity, shed = the power model's cut on the cloud, time to shed =
the measured re-placement time + the p99 service time of the requests in
flight there. The last line's ``p99_latency_ratio`` is then the modelled one;
with the live part it is the live one (the modelled one is printed above it).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np

from crosscloud.core.paths import data_dir
from crosscloud.energy.prices import UTC, CsvFeed, PriceOracle, hour_index
from crosscloud.serving.energy import ServedModel, token_rates
from crosscloud.serving.offline import (Scenario, TimedCut, crosscloud, evaluate, expected_demand, forecast_mape,
                                       nearest, optimum,
                                       price_unaware)
from crosscloud.serving.replica import ReplicaError
from crosscloud.serving.replay import build_replay, daily_profile, read_azure_trace, read_clouds
from crosscloud.serving.router import RouterError
from crosscloud.serving.traffic import Goal, GridCut, place_traffic
from crosscloud.tracking.serving_hours import BENCH_EXPERIMENT, log_benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inference_live  # beside this file

HERE = Path(__file__).resolve().parent


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=None, help="default $CROSSCLOUD_DATA_DIR or ../shared/data")
    p.add_argument("--trace", action="append", type=Path, default=None,
                   help="trace file(s); default <data-dir>/inference/AzureLLMInferenceTrace_{code,conv}.csv")
    p.add_argument("--clouds", type=Path, default=HERE / "inference_clouds.yaml")
    p.add_argument("--regions", default=None, help="price regions of the clouds, in order (default the clouds file's)")
    p.add_argument("--year", type=int, default=2023)
    p.add_argument("--start", default="2023-07-10", help="first day (UTC)")
    p.add_argument("--end", default="2023-07-12", help="last day (UTC, inclusive)")
    p.add_argument("--peak-per-hour", type=float, default=None, help="requests in the peak hour (default: the trace's)")
    p.add_argument("--trough", type=float, default=0.35)
    p.add_argument("--peak-hour", type=float, default=15.0)
    p.add_argument("--utc-offset", type=int, default=1, help="users' local time - UTC, hours")
    p.add_argument("--params-b", type=float, default=70.0)
    p.add_argument("--devices-per-replica", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rental", type=float, default=2.5, help="USD per H100-hour; others per unit of throughput")
    p.add_argument("--p99-goal-s", type=float, default=None)
    p.add_argument("--jurisdictions", default=None, help="comma list the tenant's requests may go to (default any)")
    p.add_argument("--min-share", type=float, default=0.02)
    p.add_argument("--max-utilisation", type=float, default=0.9)
    p.add_argument("--grid", default="auto:10:5:30:2", help="CLOUD:PCT:WITHIN_MIN:START_H:HOURS, or 'none'")
    p.add_argument("--no-day-ahead", action="store_true")
    p.add_argument("--no-mlflow", action="store_true", help="do not record the run in MLflow (experiment bench-inference)")
    inference_live.add_arguments(p)
    return p.parse_args(argv)


def build(args) -> Scenario:
    """The replay, the clouds and their rates, and the prices, from the arguments."""
    ddir = args.data_dir or data_dir()
    traces = args.trace or [ddir / "inference" / f"AzureLLMInferenceTrace_{k}.csv" for k in ("code", "conv")]
    trace = read_azure_trace(traces)
    clouds = read_clouds(args.clouds)
    if args.regions:
        regions = args.regions.split(",")
        if len(regions) != len(clouds):
            raise SystemExit(f"--regions names {len(regions)} regions for {len(clouds)} clouds")
        clouds = [replace(c, region=r) for c, r in zip(clouds, regions)]
    first = datetime.combine(date.fromisoformat(args.start), datetime.min.time(), UTC)
    last = datetime.combine(date.fromisoformat(args.end), datetime.min.time(), UTC) + timedelta(days=1)
    t0, hours = hour_index(first), int((last - first).total_seconds() // 3600)
    peak = args.peak_per_hour or len(trace)
    replay = build_replay(trace, t0, hours, peak, daily_profile(args.trough, args.peak_hour), args.utc_offset)
    model = ServedModel(params_b=args.params_b, devices_per_replica=args.devices_per_replica, batch=args.batch)
    rates = [token_rates(c.accelerator, model, full_w=c.power_w) for c in clouds]
    mix = (float(trace.context.mean()), float(trace.generated.mean()))
    ref = token_rates("nvidia-h100", model).mix_tps(*mix)
    rental = np.array([c.price_per_device_hour if c.price_per_device_hour is not None
                       else args.rental * r.mix_tps(*mix) / ref for c, r in zip(clouds, rates)])
    feed = CsvFeed(ddir, args.year)
    series = {c.region: feed.prices(c.region) for c in clouds}
    prices = np.array([series[c.region].window(t0, hours) for c in clouds]).T  # raises on a gap
    oracle = PriceOracle(series, hour_ahead_lags(series, t0), day_ahead=not args.no_day_ahead)

    def seen(h: int) -> np.ndarray:  # decided in the hour before: day-ahead knows it, else a forecast
        return np.array([oracle.view(c.region, t0 + h - 1, t0 + h, 1)[0] for c in clouds])

    allowed = frozenset(args.jurisdictions.split(",")) if args.jurisdictions else None
    goal = Goal(0.0, args.p99_goal_s or 60.0, allowed, args.min_share, args.max_utilisation)
    step = max(1, len(trace) // 4000)
    sample = (trace.context[::step], trace.generated[::step])
    return Scenario(replay, clouds, rates, model, goal, prices, seen, rental, sample)


def hour_ahead_lags(series: dict, t0: int, weeks: int = 2, lags=(1, 24, 168)) -> dict[str, int]:
    """Per region, the seasonal-naive lag with the least one-hour-ahead error over the weeks before ``t0``.

    Used only without day-ahead prices (``--no-day-ahead``): a decision then
    forecasts the next hour, where the last hour (lag 1) often beats a day ago.
    """
    out = {}
    for region, s in series.items():
        errors = {}
        for lag in lags:
            pairs = [(s.get(t), s.get(t - lag)) for t in range(t0 - weeks * 168, t0)]
            diffs = [abs(a - b) for a, b in pairs if a is not None and b is not None]
            errors[lag] = sum(diffs) / len(diffs) if diffs else float("inf")
        out[region] = min(lags, key=errors.get)
    return out


def grid_request(sc: Scenario, spec: str) -> TimedCut | None:
    """The grid request of ``--grid``; ``auto`` picks the cloud crosscloud loads most at its start."""
    if spec == "none":
        return None
    cloud, pct, within_min, start_h, hours = spec.split(":")
    start = min(int(start_h), sc.replay.hours - 1)
    if cloud == "auto":
        expected = expected_demand(sc.demand, start)
        plan = place_traffic(replace(sc.goal, tokens_per_s=expected), sc.offers(start, sc.seen(start)))
        cloud = max(plan.tokens_per_s, key=plan.tokens_per_s.get)
    return TimedCut(GridCut(cloud, float(pct), float(within_min) * 60), start, int(hours))


def modelled_live_figures(sc: Scenario, cut: TimedCut | None, failed: int) -> dict:
    """The live figures as the model gives them on the replay (see the module docstring)."""
    if cut is None:
        return {"failed_requests": failed, "time_to_shed_s": 0.0, "shed_pct": 0.0, "source": "modelled, no grid request"}
    h = cut.start_h
    expected = expected_demand(sc.demand, h)
    goal, offers = replace(sc.goal, tokens_per_s=expected), sc.offers(h, sc.seen(h))
    before = place_traffic(goal, offers)
    t = time.perf_counter()
    after = place_traffic(goal, offers, [cut.cut], in_force=before.tokens_per_s)
    decide_s = time.perf_counter() - t
    shed = after.sheds[0]
    return {"failed_requests": failed, "time_to_shed_s": decide_s + shed.hold_s, "shed_pct": shed.achieved_pct,
            "source": f"modelled on the replay: {shed.cloud} -{cut.cut.reduce_pct:g}% within "
                      f"{cut.cut.within_s:.0f} s at hour {h}, {shed.before_w / 1000:.1f} -> {shed.after_w / 1000:.1f} kW, "
                      f"replicas {shed.replicas_before} -> {shed.replicas_after}, share "
                      f"{before.shares[shed.cloud]:.3f} -> {after.shares[shed.cloud]:.3f}"}


def live_figures(sc: Scenario, runs: list, cut: TimedCut | None, args) -> dict | None:
    """Failed requests, latency, bytes moved, time to shed and shed through the real router and servers; None with
    ``--no-live``."""
    if args.no_live:
        return None
    try:
        return inference_live.live_figures(sc, {run.name: run for run in runs}, cut, args)
    except (RouterError, ReplicaError) as exc:
        raise SystemExit(f"the live part could not run ({exc}); --no-live gives modelled figures instead") from exc


def print_setup(sc: Scenario, args) -> None:
    r = sc.replay
    print(f"inference benchmark: {args.start} .. {args.end} ({r.hours} h), {len(r)} requests, "
          f"{r.tokens.sum() / 1e6:.1f} M tokens ({r.context.sum() / 1e6:.1f} M context), model {sc.model.name}-class "
          f"{sc.model.params_b:g}B on {sc.model.devices_per_replica} devices a replica")
    print(f"prices seen at decisions: {'forecast beyond the decision hour' if args.no_day_ahead else 'day-ahead'}; "
          f"p99 goal {sc.goal.p99_goal_s:.1f} s; standby share {sc.goal.min_share:g}; residency "
          f"{sorted(sc.goal.allowed_jurisdictions) if sc.goal.allowed_jurisdictions else 'any'}")
    print(f"{'cloud':<8}{'region':<13}{'accel.':<13}{'dev':>4}{'PUE':>5}{'rtt ms':>7}{'tok/s':>8}"
          f"{'J/ctx tok':>10}{'J/gen tok':>10}{'USD/MWh':>9}{'warm from':>10}")
    for i, (c, rt) in enumerate(zip(sc.clouds, sc.rates)):
        print(f"{c.name:<8}{c.region:<13}{c.accelerator:<13}{c.devices:>4}{c.pue:>5.2f}{c.rtt_ms:>7.0f}"
              f"{c.devices * rt.mix_tps(*sc.mix):>8.0f}{rt.j_per_context_token:>10.3f}{rt.j_per_generated_token:>10.3f}"
              f"{sc.prices[:, i].mean():>9.1f}{c.warm_from_h:>9} h")
    cap = sum(c.devices * rt.mix_tps(*sc.mix) for c, rt in zip(sc.clouds, sc.rates))
    print(f"demand: mean {sc.demand.mean():.0f}, peak {sc.demand.max():.0f} tokens/s; capacity {cap:.0f} tokens/s")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.time()
    sc = build(args)
    unaware = price_unaware(sc)
    if args.p99_goal_s is None:  # the tenant keeps the latency it has
        sc.goal = replace(sc.goal, p99_goal_s=evaluate(sc, unaware).p99_s)
    cut = grid_request(sc, args.grid)
    sc.cuts = [cut] if cut else []
    print_setup(sc, args)
    runs = [price_unaware(sc), nearest(sc), crosscloud(sc)]
    runs.append(optimum(sc, runs[2].limits))
    out = {run.name: evaluate(sc, run) for run in runs}
    print(f"{'policy':<15}{'elec USD':>10}{'USD/1M tok':>11}{'p50 s':>7}{'p99 s':>7}{'failed':>7}   tokens by cloud (M)")
    for o in out.values():
        print(f"{o.policy:<15}{o.electricity_usd:>10.2f}{o.usd_per_mtoken:>11.4f}{o.p50_s:>7.2f}{o.p99_s:>7.2f}"
              f"{o.failed:>7}   " + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in o.tokens_by_cloud.items()))
    base, mine, best = out["price-unaware"], out["crosscloud"], out["optimum"]
    reduction = 100 * (1 - mine.usd_per_mtoken / base.usd_per_mtoken)
    frac = ((base.electricity_usd - mine.electricity_usd) / (base.electricity_usd - best.electricity_usd)
            if base.electricity_usd > best.electricity_usd else float("nan"))
    if cut:
        print(f"crosscloud's reasons at hour {cut.start_h} (grid request on {cut.cut.cloud}):")
        for c in runs[2].plans[cut.start_h].considered:
            print(f"  {c.cloud}/{c.accelerator}: {c.reason}")
    modelled_ratio = mine.p99_s / base.p99_s
    live = live_figures(sc, runs, cut, args) or modelled_live_figures(sc, cut, mine.failed)
    print(f"live figures: {live['source']}")
    print(f"p99_latency_ratio: modelled on the replay {modelled_ratio:.3f}"
          + (f", live {live['p99_latency_ratio']:.3f} (last line)" if "p99_latency_ratio" in live else " (last line)"))
    print(f"crosscloud vs nearest cloud: {100 * (1 - mine.usd_per_mtoken / out['nearest'].usd_per_mtoken):.1f} % "
          f"cheaper per token, p99 ratio {mine.p99_s / out['nearest'].p99_s:.3f}")
    print(f"wall time {time.time() - t_start:.1f} s")
    mape = forecast_mape(sc.demand)
    print(f"demand forecast (production's seasonal naive, as crosscloud planned each hour): mean absolute error "
          f"{100 * mape:.1f} % of the hour's demand" if mape is not None else "demand forecast: too few hours to score")
    figures = {"cost_per_token_reduction_pct": reduction, "fraction_of_optimal": frac,
               "p99_latency_ratio": modelled_ratio, "remote_replicas": 0, **live,
               "forecast_mape": float("nan") if mape is None else mape}
    if not args.no_mlflow:
        print(f"MLflow: run {record(args, sc, runs, out, figures)} of the experiment {BENCH_EXPERIMENT}")
    print(last_line(figures))
    return 0


def record(args, sc: Scenario, runs: list, out: dict, figures: dict) -> str:
    """The run in MLflow: its arguments and figures, each policy's cost and latency and hourly shares."""
    params = {k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in vars(args).items() if v is not None}
    policies = {name: {"electricity_usd": o.electricity_usd, "usd_per_mtoken": o.usd_per_mtoken, "p50_s": o.p50_s,
                       "p99_s": o.p99_s, "failed": o.failed, "tokens": o.tokens} for name, o in out.items()}
    shares = {run.name: {c.name: run.shares[:, i] for i, c in enumerate(sc.clouds)} for run in runs}
    return log_benchmark(params, policies, shares, figures)


def last_line(figures: dict) -> str:
    """The benchmark's one machine-readable line."""
    fmt = {"cost_per_token_reduction_pct": ".1f", "fraction_of_optimal": ".3f", "p99_latency_ratio": ".3f",
           "failed_requests": "d", "time_to_shed_s": ".1f", "shed_pct": ".1f", "forecast_mape": ".3f",
           "remote_replicas": "d"}
    return " ".join(f"{k}={figures[k]:{f}}" for k, f in fmt.items())


if __name__ == "__main__":
    sys.exit(main())
