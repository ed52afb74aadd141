#!/usr/bin/env bash
# Run the DAG cross_cloud_training once with its defaults (or another PROGRAM) on the embedded federation,
# show its progress, then print the run's summary. Called by `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p "$AIRFLOW_HOME"
airflow db migrate > "$CROSSCLOUD_STATE_DIR/airflow-db-migrate.log" 2>&1
log="$CROSSCLOUD_STATE_DIR/demo.log"
echo "running DAG cross_cloud_training (full Airflow log: $log)"
# the stages as they end, and one live line of each cloud's rounds (crosscloud.tracking.progress)
# PROGRAM (make demo PROGRAM=examples/hf_causal_lm/train.py) trains that program instead of the default one
conf="{}"
if [ -n "${PROGRAM:-}" ]; then
    conf="{\"program\": \"$PROGRAM\"}"
    echo "training program $PROGRAM"
fi
airflow dags test cross_cloud_training --conf "$conf" 2>&1 | tee "$log" | crosscloud progress
grep -q "state=success" "$log" || { echo "the DAG run did not succeed; see $log" >&2; exit 1; }
echo
crosscloud summary --demo
