"""docker-compose.yaml and the Dockerfile without a Docker engine: the Compose specification's schema,
and agreement between the stack, the federation it mounts and the images it builds."""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from crosscloud.core.federation import load_federation

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def compose_errors(doc: dict) -> list[str]:
    """Errors against the Compose specification schema (the copy check-jsonschema ships, so offline)."""
    text = (importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text()
    schema = json.loads(text)
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_follows_the_compose_specification():
    assert compose_errors(COMPOSE) == []
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["airflow-scheduler"]["restart_policy"] = "always"  # not a service field
    broken["services"]["postgres"]["ports"] = {"5432": "5432"}  # a mapping where a list belongs
    errors = "\n".join(compose_errors(broken))
    assert "'restart_policy' was unexpected" in errors and "is not of type 'array'" in errors


def test_airflow_3_services_as_in_the_official_compose_file():
    services = COMPOSE["services"]
    commands = {name: services[name].get("command") for name in services}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"
    assert "airflow db migrate" in "\n".join(services["airflow-init"]["command"])
    assert services["postgres"]["image"].startswith("postgres:")
    assert "mlflow server" in services["mlflow"]["command"]
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:airflow@postgres/")
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert services[name]["depends_on"]["airflow-init"] == {"condition": "service_completed_successfully"}
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}


def test_one_minio_per_cloud_of_the_mounted_federation_with_its_bucket_and_connections():
    services = COMPOSE["services"]
    env = services["airflow-scheduler"]["environment"]
    mounted = next(v.split(":")[0] for v in services["airflow-scheduler"]["volumes"] if v.split(":")[1] == env["CROSSCLOUD_FEDERATION"])
    fed = load_federation(ROOT / mounted)
    minio = sorted(name for name in services if name.startswith("minio-") and name != "minio-init")
    assert minio == sorted(f"minio-{c.name}" for c in fed.clouds)
    init = services["minio-init"]["command"][0]
    for cloud in fed.clouds:
        endpoint = urlparse(cloud.store.endpoint_url)
        assert (endpoint.hostname, endpoint.port) == (f"minio-{cloud.name}", 9000)
        assert services["minio-init"]["depends_on"][f"minio-{cloud.name}"] == {"condition": "service_healthy"}
        bucket = urlparse(cloud.store.url).netloc
        assert cloud.name in re.search(r"for cloud in ([^;]+);", init).group(1).split()
        assert f'mc mb --ignore-existing "$$cloud/{bucket}"' in init
        for tenant in (t.name for t in fed.tenants if t.quotas.get(cloud.name)):
            conn = json.loads(env["AIRFLOW_CONN_" + cloud.store.connection_id.format(tenant=tenant).upper()])
            assert conn["conn_type"] == "aws" and conn["login"] and conn["password"]


def test_dockerfile_builds_what_compose_and_the_federations_name():
    stages = re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, flags=re.M)
    assert stages == ["airflow", "worker"]  # the worker image is the default (last) target
    assert COMPOSE["x-airflow-common"]["build"]["target"] in stages
    assert 'cpu)  pip install --index-url https://download.pytorch.org/whl/cpu "$torch"' in DOCKERFILE
    assert 'cuda) pip install "$torch"' in DOCKERFILE
    # every third-party module the worker imports is installed in the worker image
    installed = re.search(r"pip install -c constraints.txt ([^\n]+)", DOCKERFILE).group(1).split()
    probe = ("import sys, crosscloud.training.worker, crosscloud.store.base, crosscloud.store.s3; "
             "print(sorted({m.split('.')[0] for m in sys.modules}))")
    imported = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
                          .stdout.replace("'", '"'))
    wanted = {"torch", "numpy", "safetensors", "pydantic", "yaml", "fastcdc", "boto3", "psutil"}
    names = {"PyYAML": "yaml"}
    assert {m for m in imported if m in wanted} <= {"torch"} | {names.get(p, p) for p in installed}
    assert "airflow" not in imported and "mlflow" not in imported


@pytest.mark.parametrize("federation", ["federation.compose.yaml", "federation.remote.yaml"])
def test_example_federations_load(federation):
    assert load_federation(ROOT / "include" / "config" / federation).clouds
