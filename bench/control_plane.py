"""The control plane holds none of a team's model: a big program trained, retrained and registered through Airflow.

A program of ``--parameters`` parameters (default a billion: ``bench/programs/hashed_ngram.py``,
a hashed n-gram table with a small head, plain SGD) trains on ``--clouds`` (one
device each) for ``--rounds`` rounds through the DAG ``cross_cloud_training``
(``airflow dags test``), on a files dataset of ``--data-gb`` GB put with
``crosscloud dataset put``; then the DAG ``retraining`` trains it again from
the registered champion and compares; both register. Other programs run the
same way (``--program examples/byte_lm/train.py --dataset python-stdlib``).

Each DAG run is one ``airflow dags test`` process, which runs every task of it
(admit, preheat, dispatch, sync, aggregate and registration, retraining's
decide) in itself: its peak resident set (``VmHWM``, read from ``/proc`` while
it runs) bounds every task's. Sub-tasks and admission's describing child are
processes of their own; the describing child's peak is printed too.

Last line: ``airflow_peak_rss_mb=<the larger leg's peak> registered_ok=<1 when the retrain's registered version
reads back with the sha256 of the home cloud's final global> estimate_error=<|estimated / measured - 1| of the
retrain's seconds per sample, estimated from the first run's measurement> registered_name=<name>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from crosscloud.core.federation import DEFAULT_FEDERATION, load_federation
from crosscloud.core.keys import RunKeys
from crosscloud.pipeline.inputs import upload_dataset
from crosscloud.run.history import load_history
from crosscloud.run.plan import Plan
from crosscloud.scheduler.sizing import measured_figures
from crosscloud.store.commit import read_commit
from crosscloud.store.open_store import open_store
from crosscloud.tracking import registry

DATASET = "bench-bytes"
FILE_BYTES = 128 << 20


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parameters", type=float, default=1e9, help="the hashed n-gram model's size (rows x dim)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--data-gb", type=float, default=2.0, help="size of the files dataset to train on")
    p.add_argument("--clouds", nargs="+", default=["beijing", "shanghai"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--inner-steps", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--tenant", default="team-a")
    p.add_argument("--program", default="bench/programs/hashed_ngram.py")
    p.add_argument("--program-args", default="{}", help="JSON over the program's own arguments")
    p.add_argument("--dataset", default=None, help="a federation dataset instead of generating --data-gb of bytes")
    p.add_argument("--workdir", type=Path, default=None,
                   help="a fresh folder for the run's state (stores, ledger, Airflow and MLflow DBs), dataset and "
                        "logs, kept; default a new temporary one, removed at the end unless --keep")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (a 1e8 run leaves about 20 GB)")
    return p.parse_args(argv)


def program_args(args: argparse.Namespace) -> dict:
    extra = json.loads(args.program_args)
    if args.program.endswith("hashed_ngram.py"):
        extra = {"rows": int(args.parameters // args.dim), "dim": args.dim, **extra}
    return {"lr": args.lr, **extra}


def federation(args: argparse.Namespace, folder: Path) -> Path:
    """The embedded federation cut to ``--clouds`` with one device each, and the bench's files dataset."""
    raw = yaml.safe_load(DEFAULT_FEDERATION.read_text())
    raw["clouds"] = [c for c in raw["clouds"] if c["name"] in args.clouds]
    raw["links"] = [k for k in raw.get("links", []) if k["a"] in args.clouds and k["b"] in args.clouds]
    for cloud in raw["clouds"]:
        cloud["pools"] = [dict(cloud["pools"][0], count=1)]
    for tenant in raw["tenants"]:
        tenant["quotas"] = {c: 1 for c in args.clouds}
    raw["datasets"].append({"name": DATASET, "source": "files", "home": args.clouds[0],
                            "prefix": f"datasets/{DATASET}/train/", "eval_prefix": f"datasets/{DATASET}/val/"})
    path = folder / "federation.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def byte_files(folder: Path, gb: float) -> Path:
    """``gb`` GB of text in 128 MiB files (train/) and one 8 MiB held-out file (val/): this machine's stdlib,
    repeated; written once."""
    import sysconfig

    text = b"".join(p.read_bytes() for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")))
    for sub, total in (("train", int(gb * 1e9)), ("val", 8 << 20)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        for i in range(max(1, -(-total // FILE_BYTES))):
            path, size = folder / sub / f"{sub}-{i:03d}.bin", min(FILE_BYTES, total - i * FILE_BYTES)
            if not path.exists() or path.stat().st_size != size:
                reps = -(-size // len(text))
                path.write_bytes((text * reps)[:size])
    return folder


def _peak_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def dag_test(dag_id: str, conf: dict, env: dict, log: Path) -> float:
    """Run the DAG once with ``airflow dags test``; its process's peak RSS in MB (it runs every task)."""
    with open(log, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("airflow")), "dags", "test", dag_id, "--conf",
                                 json.dumps(conf)], stdout=out, stderr=subprocess.STDOUT, env=env)
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, _peak_mb(proc.pid))
            time.sleep(0.2)
    text = log.read_text()
    if proc.returncode != 0 or "state=success" not in text:
        raise SystemExit(f"{dag_id} did not succeed (exit {proc.returncode}); its log: {log}\n{text[-3000:]}")
    return peak


def describe_peak_mb(args: argparse.Namespace, env: dict) -> float:
    """The peak of admission's describing child, measured alone."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([sys.executable, "-m", "crosscloud.training.describe", "--path", args.program, "--label",
                    args.program, "--args", json.dumps({"seed": 0, "model_size": "small", **program_args(args)})],
                   check=True, capture_output=True, env=env)
    return max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


def legs(args: argparse.Namespace, env: dict, folder: Path) -> dict[str, float]:
    """The first run, then the retrain; each leg's peak RSS."""
    common = {"tenant": args.tenant, "program": args.program, "program_args": program_args(args),
              "dataset": args.dataset or DATASET, "rounds": args.rounds, "inner_steps": args.inner_steps,
              "global_batch": args.global_batch}
    first = {**common, "clouds": args.clouds, "devices_per_cloud": 1, "compression": "none",
             "eval_every_steps": args.rounds * args.inner_steps}
    peaks = {}
    for dag_id, conf in (("cross_cloud_training", first), ("retraining", common)):
        t0 = time.time()
        peaks[dag_id] = dag_test(dag_id, conf, env, folder / f"{dag_id}.log")
        print(f"{dag_id}: {time.time() - t0:.0f} s, peak RSS of its airflow process {peaks[dag_id]:.0f} MB", flush=True)
    return peaks


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def registered(args: argparse.Namespace, name: str) -> tuple[int, Plan, Plan]:
    """Whether the retrain's version reads back as the home cloud's final global; the two runs' plans."""
    from crosscloud.tracking.mlflow_runs import Tracker
    from crosscloud.store import header

    client = Tracker().client
    versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))
    if len(versions) < 2:
        raise SystemExit(f"{name}: {len(versions)} version(s) registered, expected the run's and the retrain's")
    home = open_store(load_federation().local_cloud, args.tenant)
    first, last = (Plan.load(home, args.tenant, v.tags["crosscloud.run_id"]) for v in versions[-2:])
    final = read_commit(home, RunKeys(args.tenant, last.run_id).final)["objects"]["model.safetensors"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(registry.download(versions[-1], tmp))
        ok = _file_sha256(path) == final["sha256"] and header.architecture(header.file_prefix(path)) == last.program.architecture
    return int(ok), first, last


def estimate_error(plan: Plan) -> tuple[float, str]:
    """|estimated / measured - 1| of the run's seconds per sample on the accelerator it trained on, and the
    estimate's source."""
    home = open_store(load_federation().local_cloud, plan.tenant)
    figures = measured_figures(plan, load_history(home, plan))
    if not figures:
        return float("nan"), plan.sizing.get("source", "")
    measured = figures[0]
    per = plan.sizing["seconds_per_sample"]
    estimated = per.get(measured.accelerator, per["*"])
    return abs(estimated / measured.seconds_per_sample - 1), plan.sizing["source"]


def environment(folder: Path, fed: Path) -> dict:
    """A state of its own: what the first run knows of the program is nothing, as for a new program."""
    state = folder / "state"
    airflow = state / "airflow"
    airflow.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "CROSSCLOUD_LEDGER_URL"}
    return {**env, "CROSSCLOUD_FEDERATION": str(fed), "CROSSCLOUD_STATE_DIR": str(state), "AIRFLOW_HOME": str(airflow),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow}/airflow.db",
            "MLFLOW_TRACKING_URI": f"sqlite:///{state}/mlflow.db", "CROSSCLOUD_MLFLOW_ARTIFACTS": (state / "mlartifacts").as_uri()}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    folder = args.workdir or Path(tempfile.mkdtemp(prefix="bench-control-plane-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, folder)
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace, folder: Path) -> int:
    print(f"state, dataset and logs in {folder}", flush=True)
    env = environment(folder, federation(args, folder))
    os.environ.clear()
    os.environ.update(env)
    print(f"describing child of admit: peak {describe_peak_mb(args, env):.0f} MB", flush=True)
    if args.dataset is None:
        t0 = time.time()
        sent = upload_dataset(load_federation(), args.tenant, DATASET, byte_files(folder / "data", args.data_gb))
        print(f"dataset {DATASET}: {sent['bytes'] / 1e9:.2f} GB in {sent['files']} files, put in {time.time() - t0:.0f} s")
    subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], check=True, env=env,
                   capture_output=True)
    peaks = legs(args, env, folder)
    from crosscloud.pipeline.inputs import load_job_program
    from crosscloud.core.job import JobSpec

    described = load_job_program(JobSpec(program=args.program, program_args=program_args(args)))
    name = registry.model_name(args.tenant, described.model_name)
    ok, first, last = registered(args, name)
    first_error, first_source = estimate_error(first)
    error, source = estimate_error(last)
    print(f"model: {described.parameters:,} parameters; first run sized by {first_source}: estimate error "
          f"{first_error:.3f}; the retrain sized by {source}")
    print(f"airflow_peak_rss_mb={max(peaks.values()):.0f} registered_ok={ok} estimate_error={error:.3f} "
          f"registered_name={name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
