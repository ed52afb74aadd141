-- docker-compose.yaml's PostgreSQL, first start only (docker-entrypoint-initdb.d): besides Airflow's own
-- database (POSTGRES_DB=airflow), one database and owner each for the reservation ledger and MLflow.
-- The ledger is kept apart from Airflow's database: Airflow's migrations and `airflow db clean` never
-- touch it, and crosscloud migrates it itself on first use (CROSSCLOUD_LEDGER_URL).
CREATE USER crosscloud WITH PASSWORD 'crosscloud';
CREATE DATABASE crosscloud_ledger OWNER crosscloud;
CREATE USER mlflow WITH PASSWORD 'mlflow';
CREATE DATABASE mlflow OWNER mlflow;
