"""MLflow tracking: a parent run per job, one nested child run per cloud.

Workers never talk to MLflow (a remote cloud may not reach it): they put their
timings and losses in their round commits, and the watcher logs them here.
Tags and metric names are the same for cross-cloud runs and single-cluster
baselines, so MLflow's compare view lines them up.
"""

from __future__ import annotations

import json
import os
import time

from crosscloud.core.deployment import require_single_host
from crosscloud.core.paths import state_dir
from crosscloud.run.baseline import baseline_key

TAG = "crosscloud"


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``; on one host, a SQLite file in the state folder by default."""
    if uri := os.environ.get("MLFLOW_TRACKING_URI"):
        return uri
    require_single_host("MLflow's default database (a SQLite file in this host's state folder)",
                        "set MLFLOW_TRACKING_URI to a tracking server or database every host reaches")
    return f"sqlite:///{state_dir() / 'mlflow.db'}"


def artifact_root() -> str:
    """Where new experiments keep artifacts: ``CROSSCLOUD_MLFLOW_ARTIFACTS``; on one host, the state folder."""
    if root := os.environ.get("CROSSCLOUD_MLFLOW_ARTIFACTS"):
        return root
    require_single_host("MLflow artifacts in this host's state folder",
                        "set CROSSCLOUD_MLFLOW_ARTIFACTS to an s3:// or mlflow-artifacts:/ location every host reaches")
    return (state_dir() / "mlartifacts").as_uri()


class Tracker:
    def __init__(self, uri: str | None = None):
        from mlflow.tracking import MlflowClient  # heavy import, only where tracking happens

        self.client = MlflowClient(tracking_uri=uri or tracking_uri())

    def experiment_id(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        return self.client.create_experiment(name, artifact_location=f"{artifact_root()}/{name}")

    def start_job(self, plan, experiment: str, tags: dict[str, str], queued: dict | None = None) -> dict:
        """Create the parent and per-cloud child runs; returns the plan's tracking section.

        ``queued``: how the run waited in the queue (``waited_s``, ``priority``,
        ``deadline``, ``deferrable``, ``objective``, ``reason``, and for a deferred
        run ``saved_usd`` and ``saved_kg_co2``): logged on the parent run.
        """
        exp_id = self.experiment_id(experiment)
        common = {
            f"{TAG}.tenant": plan.tenant,
            f"{TAG}.run_id": plan.run_id,
            f"{TAG}.mode": plan.spec.mode,
            f"{TAG}.baseline_key": baseline_key(plan),
            f"{TAG}.model_size": plan.spec.model_size,
            **tags,
        }
        parent = self.client.create_run(exp_id, run_name=plan.run_id, tags={**common, f"{TAG}.level": "job"})
        pid = parent.info.run_id
        spec = plan.spec
        params = {
            "clouds": ",".join(c.name for c in plan.clouds),
            "rounds": spec.rounds,
            "inner_steps": spec.inner_steps,
            "global_batch": spec.global_batch,
            "model_size": spec.model_size,
            "seed": spec.seed,
            "mode": spec.mode,
            "placement": spec.placement,
            "inner_lr": spec.inner_lr,
            "local_lr_scaling": spec.local_lr_scaling,
            "overlap": spec.overlap,
            "fold_mix": spec.fold_mix,
            "outer_lr": plan.outer.lr,
            "outer_momentum": plan.outer.momentum,
            "devices_total": sum(c.devices for c in plan.clouds),
            **{f"model.{k}": v for k, v in plan.model.to_dict().items()},
            **{f"share.{c.name}": c.share for c in plan.clouds},
        }
        self.log_params(pid, params)
        if queued:
            self.log_params(pid, {f"queue.{k}": queued[k] for k in ("priority", "deadline", "deferrable", "objective")})
            self.client.log_metric(pid, "queue_wait_s", queued["waited_s"])
            for key in ("saved_usd", "saved_kg_co2"):  # a deferrable run: against starting when first planned
                if queued.get(key) is not None:
                    self.client.log_metric(pid, f"queue_{key}", queued[key])
            self.client.log_text(pid, f"waited {queued['waited_s']:.1f} s in the queue\nstarted: {queued['reason']}\n",
                                 "queue.txt")
        self.client.log_text(pid, plan.model_dump_json(indent=2), "plan.json")
        verdicts = [f"{c.cloud}/{c.accelerator}: {'CHOSEN' if c.chosen else 'not chosen'} - {c.reason}" for c in plan.candidates]
        self.client.log_text(pid, "\n".join(verdicts) + "\n", "placement.txt")
        children = {}
        for cloud in plan.clouds:
            child = self.client.create_run(
                exp_id,
                run_name=f"{plan.run_id}/{cloud.name}",
                tags={**common, "mlflow.parentRunId": pid, f"{TAG}.level": "cloud", f"{TAG}.cloud": cloud.name},
            )
            self.log_params(
                child.info.run_id,
                {"cloud": cloud.name, "accelerator": cloud.accelerator, "devices": cloud.devices, "share": cloud.share,
                 "shards": ",".join(map(str, cloud.shards)), "method": cloud.method},
            )
            children[cloud.name] = child.info.run_id
        return {"experiment_id": exp_id, "parent_run_id": pid, "child_run_ids": children}

    def log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_series(self, run_id: str, key: str, values, batch: int = 1000) -> None:
        """``values`` as one metric whose steps are their indexes (MLflow takes at most 1000 a batch)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = [float(v) for v in values]
        for start in range(0, len(values), batch):
            self.client.log_batch(run_id, metrics=[Metric(key, v, now, step) for step, v in
                                                   enumerate(values[start:start + batch], start=start)])

    def log_round(self, plan, record: dict) -> None:
        """Parent: eval loss, wall time, clouds lost and contributions refused per round; children: per-step loss and iteration time."""
        from mlflow.entities import Metric

        tr, r, h = plan.tracking, record["round"], plan.spec.inner_steps
        lost, refused = record.get("lost", {}), record.get("refused", {})
        evaluated = {} if record["eval_loss"] is None else {"eval_loss": record["eval_loss"]}
        self.log_metrics(tr["parent_run_id"], {**evaluated, "round_wall_s": record["wall_s"],
                                               "clouds_lost": len(lost), "contributions_refused": len(refused)}, step=r)
        now = int(time.time() * 1000)
        for cloud, rec in record["clouds"].items():
            metrics = [Metric("train_loss", loss, now, r * h + i) for i, loss in enumerate(rec["losses"])]
            metrics += [Metric("iteration_time_s", s, now, r * h + i) for i, s in enumerate(rec["step_s"])]
            metrics += [Metric(f"round_{k}", rec[k], now, r) for k in ("compute_s", "upload_s", "download_s", "wait_s")]
            for i in range(0, len(metrics), 900):  # MLflow takes at most 1000 metrics per batch
                self.client.log_batch(tr["child_run_ids"][cloud], metrics=metrics[i : i + 900])
        # a lost cloud or a refused contribution flags the cloud by tag, on the parent and on the cloud's run
        for kind, clouds in (("lost", lost), ("refused", refused)):
            for cloud, why in clouds.items():
                note = f"round {r}: {why}"[:4000]  # MLflow caps tag values
                self.client.set_tag(tr["parent_run_id"], f"{TAG}.{kind}.{cloud}", note)
                self.client.set_tag(tr["child_run_ids"][cloud], f"{TAG}.{kind}", note)

    def finish(self, plan, summary: dict, logs: dict[str, str], status: str = "FINISHED") -> None:
        tr = plan.tracking
        whole = {k: v for k, v in summary["metrics"].items() if v is not None}
        self.log_metrics(tr["parent_run_id"], whole)
        self.client.log_text(tr["parent_run_id"], json.dumps(summary, indent=2), "summary.json")
        for cloud, run_id in tr["child_run_ids"].items():
            per_cloud = summary["clouds"].get(cloud, {})
            self.log_metrics(run_id, {k: v for k, v in per_cloud.items() if isinstance(v, (int, float))})
            if cloud in logs:
                self.client.log_text(run_id, logs[cloud], f"logs/{cloud}.log")
            self.client.set_terminated(run_id, status)
        self.client.set_terminated(tr["parent_run_id"], status)

    def fail(self, plan) -> None:
        for run_id in [plan.tracking["parent_run_id"], *plan.tracking["child_run_ids"].values()]:
            self.client.set_terminated(run_id, "FAILED")

    def find_baseline(self, experiment: str, key: str) -> dict | None:
        """The newest finished single-cluster run with the same model and batch config."""
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            return None
        runs = self.client.search_runs(
            [exp.experiment_id],
            filter_string=(
                f"tags.`{TAG}.mode` = 'single_cluster' and tags.`{TAG}.baseline_key` = '{key}' "
                f"and tags.`{TAG}.level` = 'job' and attributes.status = 'FINISHED'"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not runs or "iteration_time_s" not in runs[0].data.metrics:
            return None
        run = runs[0]
        return {"run_id": run.data.tags[f"{TAG}.run_id"], "mlflow_run_id": run.info.run_id, "iteration_time_s": run.data.metrics["iteration_time_s"],
                "final_eval_loss": run.data.metrics.get("final_eval_loss")}
