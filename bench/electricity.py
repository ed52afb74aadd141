"""Electricity benchmark: price-aware placement and timing against price-unaware placement, and the offline optimum.

Scenario (defaults; every one is an argument):

* **Prices**: one week of real hourly prices, 2023-07-10 00:00 to 2023-07-16
  23:00 UTC, from ``$CROSSCLOUD_DATA_DIR/electricity/prices/<REGION>_2023.csv``
  for six regions (DE-LU, FR, ES, US-CAL-CISO, US-TEX-ERCO, SG); one cloud per
  region. Jurisdictions: EU (DE-LU, FR, ES), US (US-*), SG. Work that runs past
  the week (deadlines reach up to ~3 days after it) is charged at the real
  prices of those hours; a missing price stops the benchmark with the region
  and hour (``PriceGapError``).
* **Training jobs**: the Philly-derived Gavel traces (VCs 6214e9, 6c71a0,
  b436b2, ee9e8c, 11cb48). By default each VC's jobs arrive evenly over the
  week in their arrival order (``--arrivals rank``: the same jobs and mix at
  a steady rate, so ``--load`` holds every day). With ``--arrivals span``
  each VC's arrival times are scaled from its own span onto the week
  instead; the traces are back-loaded, so most of the week's work then
  arrives in its last two days, where it exceeds the capacity: not the
  realistic offered load the benchmark is meant for. Jobs running longer than
  ``--max-runtime-h`` (48 h) on a V100 are left out (a week cannot hold them;
  the share left out is printed);
  from the rest, ``--jobs`` are taken evenly in arrival order. Job *i* gets home
  cloud ``i mod clouds``, is **deferrable** when ``(37 i) mod 100 <
  100 x --deferrable-frac`` (deadline = arrival + run time + ``--slack-h`` 24 h),
  else urgent (deadline = arrival + run time + ``--urgent-slack-h`` 2 h), and
  is **resident** (may only run in its home cloud's jurisdiction) when
  ``(61 i + 17) mod 100 < 100 x --resident-frac``. Run time = total steps /
  Gavel's measured V100 steps/s.
* **Batch inference**: one batch per cloud per day, arriving at
  ``(8 + 3 x cloud index) mod 24`` h UTC with ``--requests`` requests of
  ``--request-device-s`` device-seconds each and a deadline ``--batch-slack-h``
  (24 h) later; divisible over clouds and hours. Same residency rule.
* **Clouds**: V100s at 300 W full power (``crosscloud.energy.power``), PUE ``--pue``
  (1.2), rental ``--rental`` USD/device-hour, the same everywhere, so the
  effective price differs only through electricity. **Capacity**: each cloud
  gets the whole number of devices that makes its *offered load* -- the
  device-hours of the work whose home it is, over its devices x the week --
  ``--load`` (0.6, about the average GPU utilization reported for the Philly
  clusters), and at least the largest job's devices. Achieved loads are
  printed.

Policies on the same workload: **price-unaware**
(least-loaded, as soon as possible), **crosscloud** (online price-aware, at
each decision only day-ahead prices already published and a seasonal-naive
forecast beyond: by default ``--policy queue``, the production queue
(``queue_timing.py``); ``--policy price-lp``, the reference rolling plan
(``price_lp.py``) re-made every hour, whose starts this hour are whole and which also holds the jobs
expected in the next 24 h, forecast as those of the last 24 h; ``--policy price`` is the greedy variant that reserves at arrival
and re-plans unstarted work at each publication), and the
**optimum** (LP with the actual prices, a lower bound; ``price_lp.py``).

Electricity cost = energy of the devices while they work (full power x PUE)
at the real hourly price; idle devices are not charged to the work.
Electricity cost per unit of work = USD per device-hour of work. Carbon uses
the LCA intensity where the zone has a carbon file (energy elsewhere printed).
Forecast error: each region's seasonal-naive forecast (lag chosen by MAE on the
4 weeks before the start) measured on the benchmark week at the hours beyond
what is known, 1-48 h ahead.

Last line: ``electricity_cost_reduction_pct=<100 x (1 - crosscloud/unaware)>
fraction_of_optimal_savings=<(unaware - crosscloud)/(unaware - optimum)>
deadline_misses=<crosscloud's misses> infeasible_at_arrival=<work crosscloud named infeasible at arrival>``.
Deadlines are kept by construction (``crosscloud.scheduler.deadlines``); the table gives per policy the misses,
the work infeasible at arrival and the misses of work that was feasible.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np

from crosscloud.core.paths import data_dir
from crosscloud.energy.power import device_power
from crosscloud.energy.prices import UTC, CsvFeed, PriceOracle, check, choose_lag, evaluate_forecast, hour_index
from job_traces import read_throughputs, read_trace
from price_lp import BatchJob, CloudSpec, TrainingJob, account, infeasible_work, optimum, schedule
from queue_timing import devices_for_batches, run_queue

DEFAULT_REGIONS = "DE-LU,FR,ES,US-CAL-CISO,US-TEX-ERCO,SG"
DEFAULT_VCS = "6214e9,6c71a0,b436b2,ee9e8c,11cb48"


def jurisdiction(region: str) -> str:
    if region.startswith("US-"):
        return "US"
    if region in ("DE-LU", "FR", "ES", "NL", "BE", "AT", "IT", "PL", "DK", "SE", "NO", "FI", "PT", "CH"):
        return "EU"
    return region


def carbon_oracle(feed: CsvFeed, regions: list[str], zones: set[str], no_day_ahead: bool) -> PriceOracle:
    """Carbon intensity as a decision sees it: known up to the decision hour, forecast beyond."""
    return PriceOracle({r: feed.carbon(r) for r in regions if r in zones}, day_ahead=False)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=None, help="default $CROSSCLOUD_DATA_DIR or ../shared/data")
    p.add_argument("--regions", default=DEFAULT_REGIONS)
    p.add_argument("--year", type=int, default=2023)
    p.add_argument("--start", default="2023-07-10", help="first day (UTC)")
    p.add_argument("--end", default="2023-07-16", help="last day (UTC, inclusive)")
    p.add_argument("--vcs", default=DEFAULT_VCS)
    p.add_argument("--traces", type=Path, default=None, help="default <data-dir>/traces/philly-gavel")
    p.add_argument("--jobs", type=int, default=1200)
    p.add_argument("--max-runtime-h", type=float, default=48.0)
    p.add_argument("--deferrable-frac", type=float, default=0.5)
    p.add_argument("--slack-h", type=float, default=24.0)
    p.add_argument("--urgent-slack-h", type=float, default=2.0)
    p.add_argument("--resident-frac", type=float, default=0.3)
    p.add_argument("--requests", type=int, default=40000, help="requests per batch inference job")
    p.add_argument("--request-device-s", type=float, default=1.8)
    p.add_argument("--batch-slack-h", type=int, default=24)
    p.add_argument("--guard-urgent-slack-h", type=float, default=0.0,
                   help="deadline guard: arrivals with less slack count toward the capacity held back for urgent work")
    p.add_argument("--no-price-band", action="store_true",
                   help="plan forecast hours at the forecast alone, without its measured error on top")
    p.add_argument("--guard-window-h", type=int, default=24,
                   help="deadline guard: the hours of past arrivals that measure the urgent work to come")
    p.add_argument("--load", type=float, default=0.6, help="offered load of each cloud")
    p.add_argument("--arrivals", choices=("span", "rank"), default="rank",
                   help="arrival times: each VC's span scaled onto the week, or its jobs evenly in arrival order")
    p.add_argument("--accelerator", default="v100")
    p.add_argument("--pue", type=float, default=1.2)
    p.add_argument("--rental", type=float, default=2.0)
    p.add_argument("--no-day-ahead", action="store_true", help="only prices up to the decision hour are known")
    p.add_argument("--no-replan", action="store_true", help="greedy policy: no re-planning at publication")
    p.add_argument("--policy", choices=("queue", "price-lp", "price"), default="queue",
                   help="crosscloud's online policy: the production queue (default), or the reference rolling LP "
                        "or greedy reservations")
    p.add_argument("--objective", default="cost", help="queue policy: cost, carbon, or a carbon weight in between")
    p.add_argument("--no-make-room", action="store_true",
                   help="queue policy: a run that must start within the hour does not pause running deferrable work")
    p.add_argument("--no-expected-work", action="store_true",
                   help="queue policy: the plan of deferred runs does not leave room for the work expected to arrive")
    p.add_argument("--forecast-weeks", type=int, default=4)
    return p.parse_args(argv)


def build_jobs(args, clouds, week_h, thr):
    traces = args.traces or (args.data_dir / "traces" / "philly-gavel")
    pool, total, dropped = [], 0, 0
    for vc in args.vcs.split(","):
        tj = read_trace(traces / f"{vc}.trace")
        span = max(j.arrival_s for j in tj) or 1.0
        rank = {k: r / len(tj) for r, k in enumerate(sorted(range(len(tj)), key=lambda k: (tj[k].arrival_s, k)))}
        for k, j in enumerate(tj):
            total += 1
            rt = j.runtime_s(thr, args.accelerator) / 3600
            if rt > args.max_runtime_h:
                dropped += 1
                continue
            pool.append((rank[k] if args.arrivals == "rank" else j.arrival_s / span, vc, k, j.num_gpus, rt))
    pool.sort()
    n = min(args.jobs, len(pool))
    picked = [pool[math.floor(i * len(pool) / n)] for i in range(n)]
    names = [c.name for c in clouds]
    jobs = []
    for i, (u, vc, k, gpus, rt) in enumerate(picked):
        home = clouds[i % len(clouds)]
        arrival = min(int(u * week_h), week_h - 1)
        deferrable = (37 * i) % 100 < 100 * args.deferrable_frac
        resident = (61 * i + 17) % 100 < 100 * args.resident_frac
        allowed = frozenset(c.name for c in clouds if c.jurisdiction == home.jurisdiction) if resident else frozenset(names)
        slack = args.slack_h if deferrable else args.urgent_slack_h
        jobs.append(TrainingJob(f"{vc}:{k + 1}", gpus, rt, arrival, arrival + rt + slack, allowed, home.name))
    batches = []
    days = week_h // 24
    for d in range(days):
        for ci, home in enumerate(clouds):
            i = d * len(clouds) + ci
            arrival = d * 24 + (8 + 3 * ci) % 24
            resident = (61 * i + 17) % 100 < 100 * args.resident_frac
            allowed = frozenset(c.name for c in clouds if c.jurisdiction == home.jurisdiction) if resident else frozenset(names)
            batches.append(BatchJob(f"batch-{home.name}-d{d + 1}", args.requests * args.request_device_s / 3600, arrival,
                                    arrival + args.batch_slack_h, allowed, args.requests, home.name))
    return jobs, batches, total, dropped


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.data_dir = args.data_dir or data_dir()
    t_start = time.time()
    regions = args.regions.split(",")
    if len(set(regions)) != len(regions):
        print(f"duplicate regions in {regions}", file=sys.stderr)
        return 2
    first = datetime.combine(date.fromisoformat(args.start), datetime.min.time(), UTC)
    last = datetime.combine(date.fromisoformat(args.end), datetime.min.time(), UTC) + timedelta(days=1)
    t0, week_h = hour_index(first), int((last - first).total_seconds() // 3600)
    feed = CsvFeed(args.data_dir, args.year)
    series = {r: feed.prices(r) for r in regions}
    zones = set(feed.zones())
    power = device_power(args.accelerator)
    # capacity: first the clouds without devices to find the work homed at each
    proto = [CloudSpec(r.lower(), r, 1, args.pue, power.full_w, args.rental, jurisdiction(r)) for r in regions]
    thr = read_throughputs((args.traces or args.data_dir / "traces" / "philly-gavel") / "simulation_throughputs.json")
    jobs, batches, total, dropped = build_jobs(args, proto, week_h, thr)
    offered = {c.name: 0.0 for c in proto}
    biggest = {c.name: 1 for c in proto}
    for j in jobs:
        offered[j.home] += j.devices * j.runtime_h
        for c in j.allowed:
            biggest[c] = max(biggest[c], j.devices)
    for b in batches:
        offered[b.home] += b.device_hours
    clouds = [CloudSpec(c.name, c.region, max(math.ceil(offered[c.name] / (week_h * args.load)), biggest[c.name]),
                        c.pue, c.power_w, c.rental, c.jurisdiction) for c in proto]
    horizon = int(math.ceil(max([j.deadline for j in jobs] + [b.deadline for b in batches] + [week_h]))) + 48  # room for late starts
    prices = {r: np.asarray(series[r].window(t0, horizon)) for r in regions}  # raises on a gap
    carbon = {}
    for r in regions:
        if r in zones:
            cs = feed.carbon(r)
            carbon[r] = np.asarray(cs.window(t0, horizon))

    print(f"electricity benchmark: {args.start} .. {args.end} ({week_h} h, horizon {horizon} h to cover deadlines), "
          f"data {args.data_dir}")
    print(f"day-ahead prices known at decisions: {'no (only up to the decision hour)' if args.no_day_ahead else 'yes, published 12:00 UTC for the next UTC day'}; "
          f"crosscloud policy: {args.policy}" + ("" if args.policy == "price-lp" else
                                                   f", re-plan unstarted work at publication: {'no' if args.no_replan else 'yes'}"))
    now = first + timedelta(hours=horizon)
    for r in regions:
        h = check(series[r], now)
        print(f"  feed {r}: {len(series[r].values)} h, {len(h.gaps)} gaps, {'carbon ' + r if r in carbon else 'no carbon file'}")
    print(f"training jobs: {len(jobs)} of {total - dropped} with run time <= {args.max_runtime_h:g} h "
          f"({dropped} of {total} longer ones left out), "
          f"{sum(j.deadline - j.arrival - j.runtime_h > args.urgent_slack_h + 1e-9 for j in jobs)} deferrable "
          f"(+{args.slack_h:g} h), {sum(len(j.allowed) < len(clouds) for j in jobs)} resident")
    print(f"batch inference: {len(batches)} batches x {args.requests} requests x {args.request_device_s:g} device-s "
          f"= {sum(b.device_hours for b in batches):.0f} device-h, deadline +{args.batch_slack_h} h")
    # the busiest 24 h: device-hours of the work homed at a cloud arriving in that day, over its devices x 24 h
    arriving = {c.name: np.zeros(week_h) for c in clouds}
    for w in [*jobs, *batches]:
        arriving[w.home][w.arrival] += w.devices * w.runtime_h if isinstance(w, TrainingJob) else w.device_hours
    peak = {k: np.convolve(v, np.ones(24), mode="valid").max() / 24 for k, v in arriving.items()}
    print(f"{'cloud':<14}{'region':<13}{'jur.':<5}{'devices':>8}{'offered load':>14}{'peak day':>10}{'mean price':>12}")
    for c in clouds:
        print(f"{c.name:<14}{c.region:<13}{c.jurisdiction:<5}{c.devices:>8}{offered[c.name] / (c.devices * week_h):>14.2f}"
              f"{peak[c.name] / c.devices:>10.2f}"
              f"{prices[c.region][:week_h].mean():>12.1f}")

    # forecast: lag chosen per region on the weeks before; error on the benchmark week
    lags, fc_rows = {}, []
    for r in regions:
        lag, past = choose_lag(series[r], t0, weeks=args.forecast_weeks, day_ahead=not args.no_day_ahead)
        lags[r] = lag
        err = {L: evaluate_forecast(series[r], t0, t0 + week_h, L, 48, not args.no_day_ahead) for L in (24, 168)}
        fc_rows.append((r, lag, past[lag], err))
    print("forecast (seasonal naive, 1-48 h beyond the known prices): lag chosen on the "
          f"{args.forecast_weeks} weeks before; error on the benchmark week")
    print(f"  {'region':<13}{'lag':>5}{'past MAE':>10}{'MAE':>8}{'sMAPE%':>8}   other lag: MAE sMAPE%")
    for r, lag, past, err in fc_rows:
        other = 168 if lag == 24 else 24
        print(f"  {r:<13}{lag:>5}{past['mae']:>10.1f}{err[lag]['mae']:>8.1f}{err[lag]['smape_pct']:>8.1f}"
              f"   {other}: {err[other]['mae']:.1f} {err[other]['smape_pct']:.1f}")
    mae = np.mean([e[lag]["mae"] for _, lag, _, e in fc_rows])
    smape = np.mean([e[lag]["smape_pct"] for _, lag, _, e in fc_rows])

    oracle = PriceOracle(series, lags, day_ahead=not args.no_day_ahead)
    unaware = schedule("least-loaded", jobs, batches, clouds, horizon)
    band = {r: past["mae"] for r, _, past, _ in fc_rows}  # measured on the weeks before the start
    guard = {"urgent_slack_h": args.guard_urgent_slack_h, "holdback_window_h": args.guard_window_h,
             "band": None if args.no_price_band else band, "known_until": oracle.known_until}
    if args.policy == "queue":
        carbon_view = carbon_oracle(feed, regions, zones, args.no_day_ahead).view if args.objective != "cost" else None
        aware = run_queue(jobs, batches, clouds, horizon, oracle.view, t0, args.objective, carbon_view,
                          devices_for_batches(clouds), oracle.known_until, None if args.no_price_band else band,
                          not args.no_make_room, not args.no_expected_work)
    else:
        aware = schedule(args.policy, jobs, batches, clouds, horizon, view=oracle.view, t0=t0,
                         replan=not args.no_replan, **(guard if args.policy == "price-lp" else {}))
    opt = optimum(jobs, batches, clouds, horizon, prices)
    work = sum(j.devices * j.runtime_h for j in jobs) + sum(b.device_hours for b in batches)
    alone = infeasible_work(jobs, batches, clouds)
    unaware.infeasible = alone  # price-unaware admits everything: only what no policy could meet is named
    print(f"{'policy':<16}{'elec USD':>10}{'USD/dev-h':>10}{'total USD':>11}{'MWh':>8}{'t CO2':>8}{'misses':>8}"
          f"{'infeasible':>11}{'missed feasible':>16}")
    acc = {}
    for name, s in (("price-unaware", unaware), ("crosscloud", aware)):
        a = account(s.placements, clouds, prices, carbon)
        acc[name] = a
        print(f"{name:<16}{a.electricity_usd:>10.0f}{a.electricity_usd / work:>10.4f}{a.total_usd:>11.0f}"
              f"{a.energy_mwh:>8.2f}{a.carbon_kg / 1000:>8.2f}{len(s.misses):>8}{len(s.infeasible):>11}"
              f"{len(s.missed_feasible):>16}")
    for name, why in sorted(aware.infeasible.items()):
        print(f"  infeasible at arrival (crosscloud): {name}: {why}")
    for name, hour in sorted(aware.at_risk.items(), key=lambda kv: kv[1]):
        print(f"  admitted, then no longer protected (crosscloud): {name} from hour {hour}")
    print(f"{'optimum (LP)':<16}{opt.electricity_usd:>10.0f}{opt.electricity_usd / work:>10.4f}{'':>11}{'':>8}{'':>8}{0:>8}"
          f"   ({opt.status}; {opt.fractional_jobs} training jobs split by the relaxation)")
    if carbon and acc["crosscloud"].energy_without_carbon_mwh:
        print(f"carbon covers {', '.join(sorted(carbon))}; energy in regions without carbon data: "
              + ", ".join(f"{k} {v.energy_without_carbon_mwh:.2f} MWh" for k, v in acc.items()))
    for name, s in (("price-unaware", unaware), ("crosscloud", aware)):
        used = {c.name: 0.0 for c in clouds}
        for p in s.placements:
            used[p.cloud] += p.device_hours
        print(f"  {name} device-hours per cloud: " + ", ".join(f"{k} {v:.0f}" for k, v in used.items()))
    if aware.preempted:
        why = (f"for prices{'' if args.no_make_room else ' or for urgent work'}, each resumed later on its own devices "
               "with a restart's cost" if args.policy == "queue"
               else "(checkpoint, resumed later, 0.25 h of work redone) to start urgent ones")
        print(f"crosscloud paused {len(aware.preempted)} running deferrable job(s) {why}")
    print(f"forecast error (mean over regions, chosen lag): MAE {mae:.1f} USD/MWh, sMAPE {smape:.1f} %")
    print(f"work: {work:.0f} device-hours; wall time {time.time() - t_start:.1f} s")
    base, mine = acc["price-unaware"].electricity_usd, acc["crosscloud"].electricity_usd
    reduction = 100 * (1 - mine / base)
    frac = (base - mine) / (base - opt.electricity_usd) if base > opt.electricity_usd else float("nan")
    kg = {k: a.carbon_kg for k, a in acc.items()}  # over the regions with a carbon signal
    cut = 100 * (1 - kg["crosscloud"] / kg["price-unaware"]) if kg["price-unaware"] else float("nan")
    print(f"electricity_cost_reduction_pct={reduction:.1f} fraction_of_optimal_savings={frac:.3f} "
          f"deadline_misses={len(aware.misses)} infeasible_at_arrival={len(aware.infeasible)} carbon_reduction_pct={cut:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
