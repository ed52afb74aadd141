"""Demand-response benchmark: a grid asks one cloud to cut its power mid-run; how fast and how deep, at what cost.

A real cross-cloud training run (the engine's stages, ``pipeline.stages.run_job``) on
the embedded local clouds. Once ``--at-round`` rounds are committed, a request
arrives to cut ``--cloud``'s power by ``--reduce-pct`` within ``--within-s``
seconds. crosscloud plans the cheapest answer (``grid.demand_response.plan_shed``:
throttle the cloud's devices under a power cap, or shift its share of the
batch to the run's other clouds), tells the run's coordinator, and waits until
the cloud's sub-task shows it in its round commits; after ``--hold-rounds``
more rounds the request ends and the work is restored.

Figures (local clouds' power is modelled: ``crosscloud.energy.power``, fitted from the DVFS
sweep in ``$CROSSCLOUD_DATA_DIR/power``):

- ``time_to_shed_s``: from the request to the start of the first round the
  cloud's sub-task ran under the action (the cut holds from then on);
- ``shed_pct``: modelled draw of the cloud before minus after, over before;
- ``rounds_lost``: rounds whose contribution from the cloud never reached the
  global model (read from the committed history), plus rounds redone;
- ``finished``: the run completed all its rounds; ``restored``: the rounds
  after the request ran at full share and power again.

Last line: ``time_to_shed_s=<s> shed_pct=<pct> rounds_lost=<n>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from crosscloud.core.federation import load_federation
from crosscloud.core.job import JobSpec
from crosscloud.core.keys import RunKeys
from crosscloud.energy.power import fit_power_curve
from crosscloud.grid.demand_response import respond, restore, verify
from crosscloud.pipeline.stages import run_job
from crosscloud.store.open_store import open_store


def history(fed, tenant: str, run_id: str) -> list[dict]:
    home = open_store(fed.local_cloud, tenant)
    key = RunKeys(tenant, run_id).history
    return json.loads(home.get(key)) if home.exists(key) else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cloud", default="beijing")
    ap.add_argument("--reduce-pct", type=float, default=10.0)
    ap.add_argument("--within-s", type=float, default=300.0)
    ap.add_argument("--at-round", type=int, default=3)
    ap.add_argument("--hold-rounds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--inner-steps", type=int, default=25)
    ap.add_argument("--model-size", default="small")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    fed, curve = load_federation(), fit_power_curve()
    spec = JobSpec(rounds=args.rounds, inner_steps=args.inner_steps, model_size=args.model_size, seed=args.seed)
    run_id = f"bench-dr-{time.strftime('%Y%m%d-%H%M%S')}"
    outcome: dict = {}

    def train() -> None:
        try:
            outcome["summary"] = run_job(spec, run_id, log=lambda m: None, compare_baseline=False)
        except Exception as exc:  # reported below; the benchmark still prints its line
            outcome["error"] = repr(exc)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    print(f"run {run_id}: {spec.rounds} rounds x {spec.inner_steps} steps, model {spec.model_size}", flush=True)
    while len(history(fed, spec.tenant, run_id)) < args.at_round and trainer.is_alive():
        time.sleep(0.2)
    plan, issued = respond(fed, args.cloud, args.reduce_pct, args.within_s, curve)
    at_round = len(history(fed, spec.tenant, run_id))
    print(f"request after round {at_round - 1}: cut {args.cloud} by {args.reduce_pct:g}% within {args.within_s:g} s; "
          f"modelled draw {plan.before_w:.1f} W, target {plan.target_w:.1f} W", flush=True)
    for a in plan.actions:
        print(f"  action on {a.run_id}: {a.kind}" + (f" to a {a.cap:.0%} cap" if a.kind == "throttle" else "")
              + f", saves {a.saved_w:.1f} W, gives up {a.progress_lost:.1%} of the run's throughput", flush=True)
    for why in plan.refused:
        print(f"  refused: {why}", flush=True)
    result = verify(fed, plan, issued, curve, timeout_s=args.within_s)
    print(f"cut held: {result['held']}, after {result['time_to_shed_s']} s; draw {result['power_after_w']} W "
          f"({result['shed_pct']:.1f}% less)", flush=True)
    while len(history(fed, spec.tenant, run_id)) < at_round + args.hold_rounds and trainer.is_alive():
        time.sleep(0.2)
    restore(fed, plan)
    ended = len(history(fed, spec.tenant, run_id))
    print(f"request over after round {ended - 1}: work restored", flush=True)
    trainer.join()
    done = history(fed, spec.tenant, run_id)
    finished = "summary" in outcome and len(done) == spec.rounds
    lost = sum(1 for r in done if args.cloud not in r["clouds"]) + max(0, len(done) - spec.rounds)
    print(f"{'cloud':<12}" + "".join(f"{r['round']:>7}" for r in done))
    for c in sorted(done[0]["clouds"]) if done else []:
        cells = []
        for r in done:
            rec = r["clouds"].get(c, {})
            cells.append("  idle" if not rec.get("step_s") else f"{rec.get('cap', 1.0):>6.0%}")
        print(f"{c:<12}" + "".join(f"{x:>7}" for x in cells) + "   (power cap per round; idle = work shifted away)")
    # an action lands up to three rounds after it is asked for: the coordinator may already be combining
    # the next round (workers run a round ahead), and a global's directives apply to the round after it
    tail = [r["clouds"].get(args.cloud, {}) for r in done[ended + 3:]]
    restored = all(rec.get("step_s") and rec.get("cap", 1.0) == 1.0 for rec in tail)
    print(f"restored after the request: {restored if tail else 'not observed (too few rounds after it)'}")
    if "summary" in outcome:
        m = outcome["summary"]["metrics"]
        print(f"run finished: {finished}; eval loss {m['eval_loss_start']:.4f} -> {m['final_eval_loss']:.4f}")
    else:
        print(f"run failed: {outcome.get('error')}")
    tts = result["time_to_shed_s"]
    print(f"time_to_shed_s={'nan' if tts is None else f'{tts:.2f}'} shed_pct={result['shed_pct']:.2f} rounds_lost={lost}")
    return 0 if finished and result["held"] and (restored or not tail) else 1


if __name__ == "__main__":
    sys.exit(main())
