#!/usr/bin/env bash
# Run the DAG cross_cloud_training once with its defaults on the embedded federation,
# show its progress, then print the run's summary. Called by `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p "$AIRFLOW_HOME"
airflow db migrate > "$CROSSCLOUD_STATE_DIR/airflow-db-migrate.log" 2>&1
log="$CROSSCLOUD_STATE_DIR/demo.log"
echo "running DAG cross_cloud_training (full Airflow log: $log)"
airflow dags test cross_cloud_training 2>&1 | tee "$log" \
  | grep --line-buffered -E '\[DAG TEST\] end task|placement [a-z]|cloud [a-z0-9-]+: share|preheat: |baseline: |eval loss [0-9]|\[[a-z0-9-]+\] round [0-9]|round [0-9]+: eval' \
  | sed -u -E -e 's/^[0-9TZ:.-]+ \[[a-z ]+\] //' -e 's/ +\[[A-Za-z0-9_.]+\] +loc=.*$//' \
      -e 's/^\[DAG TEST\] end task task_id=([a-z_]+) map_index=(-1|([0-9]+)).*/stage done: \1 \3/'
grep -q "state=success" "$log" || { echo "the DAG run did not succeed; see $log" >&2; exit 1; }
echo
crosscloud summary --demo
