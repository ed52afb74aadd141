"""The control plane holds none of a team's model: a big program trained, retrained and registered through Airflow.

A program of ``--parameters`` parameters (default a billion: ``bench/programs/hashed_ngram.py``,
a hashed n-gram table with a small head, plain SGD) trains on ``--clouds`` (one
device each) for ``--rounds`` rounds through the DAG ``cross_cloud_training``
(probed first: ``--probe-steps``), on a files dataset of ``--data-gb`` GB put with
``crosscloud dataset put``; then the DAG ``retraining`` trains it again from
the registered champion and compares; both register. Other programs run the
same way (``--program examples/byte_lm/train.py --dataset python-stdlib``).

The DAG runs go through a real ``airflow standalone`` (scheduler, LocalExecutor,
api-server, dag-processor, triggerer: the tests' ``tests/airflowstandalone.py``),
so that every task runs in a task process of its own, as on a deployment's
workers. A sampler reads every task process's peak resident set (``VmHWM``,
from ``/proc``, the processes Airflow titles ``airflow worker -- <task
instance id>``) while it runs; the API names their tasks afterwards.
Sub-tasks and admission's describing child are processes of their own, not
Airflow's; the describing child's peak is printed too.

Last line: ``airflow_peak_rss_mb=<the highest task process's peak> registered_ok=<1 when the retrain's registered version
reads back with the sha256 of the home cloud's final global> estimate_error=<|estimated / measured - 1| of the
first run's seconds per sample, estimated from its probe's measurement (``--probe-steps``)> registered_name=<name>``.
A line before it gives the retrain's error too, estimated from the first run's measurement.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' standalone Airflow
from airflowstandalone import AirflowStandalone  # noqa: E402

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
    p.add_argument("--probe-steps", type=int, default=10,
                   help="the first run's probe_steps: a probe of this many steps measures the program before its "
                        "first placement (0: the first run is sized by an estimate)")
    p.add_argument("--timeout-s", type=float, default=7200.0, help="the longest a DAG run may take")
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


TASK_TITLE = "airflow worker -- "  # the task runner's process title, then its task instance id


class TaskPeaks:
    """Every Airflow task process's peak resident set (MB) by task instance id, sampled from ``/proc``."""

    def __init__(self, every_s: float = 0.1):
        self.peaks: dict[str, float] = {}
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> "TaskPeaks":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self._every_s):
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit() and (sampled := _task_peak(proc)):
                    ti, mb = sampled
                    self.peaks[ti] = max(self.peaks.get(ti, 0.0), mb)


def _task_peak(proc: Path) -> tuple[str, float] | None:
    """(task instance id, VmHWM in MB) of a task process; None for any other process (or one gone)."""
    try:
        title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
        if not title.startswith(TASK_TITLE) or "LocalExecutor" in title:  # the executor's worker supervises it
            return None
        status = (proc / "status").read_text()
    except OSError:
        return None
    ti = title[len(TASK_TITLE):].split()[0]
    hwm = next((line for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return (ti, int(hwm.split()[1]) / 1024) if hwm else None


class BenchAirflow(AirflowStandalone):
    """The tests' standalone Airflow, on the bench's federation, data and a long wait."""

    def __init__(self, folder: Path, fed: Path):
        super().__init__(folder)
        self.federation = fed

    def env(self) -> dict[str, str]:
        # only the bench's own runs: no scheduled retraining of the champion beside them
        env = {**super().env(), "CROSSCLOUD_FEDERATION": str(self.federation),
               "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}
        env.pop("CROSSCLOUD_LEDGER_URL", None)  # the state folder's own ledger: a new program, known nowhere
        if data := os.environ.get("CROSSCLOUD_DATA_DIR"):
            env["CROSSCLOUD_DATA_DIR"] = data  # the shared prices, not the tests' empty folder
        else:
            env.pop("CROSSCLOUD_DATA_DIR")
        return env

    def failed_logs(self, dag_id: str, run_id: str, lines: int = 40) -> str:
        """The end of each failed task's log of a run."""
        failed = [t["task_id"] for t in self.task_instances(dag_id, run_id) if t["state"] in ("failed", "upstream_failed")]
        out = [f"failed tasks: {failed}; logs under {self.home / 'logs'}"]
        for task in failed:
            for log in sorted((self.home / "logs").glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task}/**/*.log")):
                out += [f"--- {log}", *log.read_text(errors="replace").splitlines()[-lines:]]
        return "\n".join(out)

    def task_names(self, dag_id: str, run_id: str) -> dict[str, str]:
        """Task instance id -> task id (and map index) of a run's tasks."""
        return {t["id"]: t["task_id"] + (f"[{t['map_index']}]" if t["map_index"] >= 0 else "")
                for t in self.task_instances(dag_id, run_id)}


def dag_run(server: BenchAirflow, dag_id: str, conf: dict, timeout_s: float) -> tuple[str, dict[str, float]]:
    """Run the DAG once through the scheduler; its run id and each of its task processes' peak RSS in MB, by task."""
    with TaskPeaks() as sampled:
        run_id = server.trigger(dag_id, conf)
        run = server.wait(dag_id, run_id, timeout_s)
    if run["state"] != "success":
        raise SystemExit(f"{dag_id} run {run_id} ended {run['state']}; {server.failed_logs(dag_id, run_id)}")
    names = server.task_names(dag_id, run_id)
    peaks: dict[str, float] = {}
    for ti, mb in sampled.peaks.items():
        if ti in names:
            peaks[names[ti]] = max(peaks.get(names[ti], 0.0), mb)
    return run_id, peaks


def describe_peak_mb(args: argparse.Namespace, env: dict) -> float:
    """The peak of admission's describing child, measured alone."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([sys.executable, "-m", "crosscloud.training.describe", "--path", args.program, "--label",
                    args.program, "--args", json.dumps({"seed": 0, "model_size": "small", **program_args(args)})],
                   check=True, capture_output=True, env=env)
    return max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


def legs(args: argparse.Namespace, server: BenchAirflow) -> tuple[list[str], dict[str, float]]:
    """The first run, then the retrain: their run ids, and every task process's peak RSS in MB by leg and task."""
    common = {"tenant": args.tenant, "program": args.program, "program_args": program_args(args),
              "dataset": args.dataset or DATASET, "rounds": args.rounds, "inner_steps": args.inner_steps,
              "global_batch": args.global_batch}
    first = {**common, "clouds": args.clouds, "devices_per_cloud": 1, "compression": "none",
             "eval_every_steps": args.rounds * args.inner_steps, "probe_steps": args.probe_steps}
    peaks, run_ids = {}, []
    for dag_id, conf in (("cross_cloud_training", first), ("retraining", common)):
        t0 = time.time()
        run_id, tasks = dag_run(server, dag_id, conf, args.timeout_s)
        run_ids.append(run_id)
        print(f"{dag_id}: {time.time() - t0:.0f} s; task processes' peak RSS (MB): "
              + ", ".join(f"{task} {mb:.0f}" for task, mb in sorted(tasks.items(), key=lambda kv: -kv[1])), flush=True)
        peaks.update({f"{dag_id}.{task}": mb for task, mb in tasks.items()})
    return run_ids, peaks


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def registered(args: argparse.Namespace, name: str, first_id: str, last_id: str) -> tuple[int, Plan, Plan]:
    """Whether the retrain's version reads back as the home cloud's final global; the two runs' plans."""
    from crosscloud.tracking.mlflow_runs import Tracker
    from crosscloud.store import header

    client = Tracker().client
    versions = {v.tags.get("crosscloud.run_id"): v for v in client.search_model_versions(f"name = '{name}'")}
    if first_id not in versions or last_id not in versions:
        raise SystemExit(f"{name}: versions of runs {sorted(map(str, versions))}; expected {first_id} and {last_id}")
    home = open_store(load_federation().local_cloud, args.tenant)
    first, last = (Plan.load(home, args.tenant, run_id) for run_id in (first_id, last_id))
    final = read_commit(home, RunKeys(args.tenant, last.run_id).final)["objects"]["model.safetensors"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(registry.download(versions[last_id], tmp))
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
    """A fresh state: what the first run knows of the program is nothing, as for a new program."""
    print(f"state, dataset and logs in {folder}", flush=True)
    server = BenchAirflow(folder, federation(args, folder))
    server.start()
    try:
        os.environ.update(server.env())  # this process reads the same stores, ledger and registry
        print(f"describing child of admit: peak {describe_peak_mb(args, server.env()):.0f} MB", flush=True)
        if args.dataset is None:
            t0 = time.time()
            sent = upload_dataset(load_federation(), args.tenant, DATASET, byte_files(folder / "bytes", args.data_gb))
            print(f"dataset {DATASET}: {sent['bytes'] / 1e9:.2f} GB in {sent['files']} files, put in "
                  f"{time.time() - t0:.0f} s", flush=True)
        run_ids, peaks = legs(args, server)
    finally:
        server.stop()
    return report(args, run_ids, peaks)


def report(args: argparse.Namespace, run_ids: list[str], peaks: dict[str, float]) -> int:
    from crosscloud.core.job import JobSpec
    from crosscloud.pipeline.inputs import load_job_program

    described = load_job_program(JobSpec(program=args.program, program_args=program_args(args)))
    name = registry.model_name(args.tenant, described.model_name)
    ok, first, last = registered(args, name, *run_ids)
    first_error, first_source = estimate_error(first)
    error, source = estimate_error(last)
    print(f"model: {described.parameters:,} parameters; the first run sized by {first_source}: estimate error "
          f"{first_error:.3f}; the retrain sized by {source}: estimate error {error:.3f}")
    top = max(peaks, key=peaks.get)
    print(f"highest task process: {top}, {peaks[top]:.0f} MB")
    print(f"airflow_peak_rss_mb={peaks[top]:.0f} registered_ok={ok} estimate_error={first_error:.3f} "
          f"registered_name={name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
