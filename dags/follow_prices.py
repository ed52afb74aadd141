"""
### Follow prices

Every hour (electricity prices change hourly), for each running training run
whose job set `follow_prices`: weigh what the whole run pays per unit of
work -- every held device's rental and draw at its cloud's electricity price
now x PUE, over the throughput of the clouds that train -- with and without
each cloud's share, and tell the run's coordinator to move a dear cloud's
share of the batch to the run's other clouds from its next round (or to give
it back when prices turn). Clouds under a grid request (`demand_response`)
are left as the request set them; a run whose clouds' prices are not all
known is left unchanged, and the log says why.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, task


@dag(
    dag_id="follow_prices",
    schedule="@hourly",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["crosscloud", "electricity"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
)
def follow_prices():
    @task
    def shift_shares() -> list[dict]:
        from crosscloud.core.federation import load_federation
        from crosscloud.grid.following_prices import follow_prices_all
        from crosscloud_airflow.connections import use_airflow_connections

        use_airflow_connections()
        decisions = follow_prices_all(load_federation())
        for d in decisions:
            state = f"away: {d['away'] or 'none'}" + (f", changed {d['changed']}" if d["changed"] else "")
            print(f"{d['tenant']}/{d['run_id']}: {state}; {'; '.join(d['unknown'])}")
        return decisions

    shift_shares()


follow_prices()
