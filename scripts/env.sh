# Environment for running crosscloud's Airflow and MLflow on a project-local state folder.
# Sourced by the Makefile and by users: `source scripts/env.sh`.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CROSSCLOUD_STATE_DIR="${CROSSCLOUD_STATE_DIR:-$_root/.state}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$CROSSCLOUD_STATE_DIR/airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$_root/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$_root/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-sqlite:///$AIRFLOW_HOME/airflow.db}"
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$CROSSCLOUD_STATE_DIR/mlflow.db}"
export CROSSCLOUD_MLFLOW_ARTIFACTS="${CROSSCLOUD_MLFLOW_ARTIFACTS:-file://$CROSSCLOUD_STATE_DIR/mlartifacts}"
unset _root
