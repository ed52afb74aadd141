"""
### Cloud membership

Join, drain or re-activate a cloud of the federation while everything runs.

- **join** runs the join check on the cloud: every tenant with quota there
  writes and reads its store with its own credentials, a tiny sub-task is
  started through the cloud's launcher and trains one step in its
  environment, and an adapted image must exist for each of its accelerators.
  A cloud declared `state: joining` receives work only once this passes; a
  failed check keeps work away from any cloud and the task fails with what
  broke.
- **drain**: the cloud takes no new sub-tasks; the running ones finish.
- **activate**: the cloud takes work again.

The next placement sees the change; nothing restarts. `crosscloud cloud
join|drain|activate NAME` does the same from a shell.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task


@dag(
    dag_id="cloud_membership",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    doc_md=__doc__,
    tags=["crosscloud", "operations"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    params={
        "cloud": Param("singapore", type="string", description="Cloud of the federation file."),
        "action": Param("join", enum=["join", "drain", "activate"], description="What to do with it."),
    },
)
def cloud_membership():
    @task
    def change_membership() -> str:
        from crosscloud.core.federation import load_federation
        from crosscloud.pool import membership
        from crosscloud_airflow.connections import use_airflow_connections

        use_airflow_connections()
        params = get_current_context()["params"]
        fed, name = load_federation(), params["cloud"]
        if params["action"] == "join":
            ok, detail = membership.join(fed, name)
            if not ok:
                raise RuntimeError(f"{name} did not pass its join check: {detail}")
            return f"{name} joined: {detail}"
        getattr(membership, params["action"])(fed, name)
        return f"{name}: {params['action']}"

    change_membership()


cloud_membership()
