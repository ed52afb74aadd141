"""docker-compose.yaml and the Dockerfile without a Docker engine: the Compose specification's schema,
and agreement between the stack, the federation it mounts and the images it builds.

The stack is a deployment of several hosts (CeleryExecutor): what every host must share, what a
worker on another host must reach, and that no cloud relies on one host, are read from the file
itself. The cloud hosts' SSH login (keys, sshd flags, the Connections airflow-init makes) is
exercised against a real sshd with the very commands the file gives.
"""

from __future__ import annotations

import copy
import getpass
import importlib.resources
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml
from cryptography.fernet import Fernet
from sqlalchemy.engine import make_url

from crosscloud.core.federation import load_federation

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docker-compose.yaml").read_text()
COMPOSE = yaml.safe_load(TEXT)  # as written: what the schema checks
DOCKERFILE = (ROOT / "Dockerfile").read_text()
INIT_SQL = (ROOT / "deploy" / "postgres-init.sql").read_text()


def interpolated(text: str) -> str:
    """The file as `docker compose` reads it with no .env: ${VAR:-default} -> default, $$ -> $."""
    return re.sub(r"\$\$|\$\{(\w+)(?::?-([^}]*))?\}", lambda m: "$" if m.group(0) == "$$" else (m.group(2) or ""), text)


STACK = yaml.safe_load(interpolated(TEXT))  # as it runs: the values the checks below compare
MAIN_HOST_TEXT = (ROOT / "deploy" / "compose.main-host.yaml").read_text()  # the override of a multi-host main host
MAIN_HOST = yaml.safe_load(interpolated(MAIN_HOST_TEXT))
SERVICES = STACK["services"]
COMMON = STACK["x-airflow-common"]
AIRFLOW = sorted(n for n, s in SERVICES.items() if s.get("image") == COMMON["image"] and n != "mlflow")
DEFAULT = [n for n in AIRFLOW if not SERVICES[n].get("profiles")]  # what `docker compose up` starts
WORKERS = [n for n in DEFAULT if SERVICES[n]["command"][:2] == ["celery", "worker"]]
REMOTE = "airflow-worker-remote"
# what every Airflow service on every host must have alike
SHARED = ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL",
          "AIRFLOW__CELERY__RESULT_BACKEND", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET",
          "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "CROSSCLOUD_LEDGER_URL",
          "CROSSCLOUD_LEASE_S", "CROSSCLOUD_FEDERATION", "MLFLOW_TRACKING_URI", "CROSSCLOUD_MLFLOW_ARTIFACTS")
# the URLs of the servers a worker talks to
SERVER_URLS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL", "AIRFLOW__CELERY__RESULT_BACKEND",
               "AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "CROSSCLOUD_LEDGER_URL", "MLFLOW_TRACKING_URI")


def env(service: str) -> dict:
    return SERVICES[service]["environment"]


def mounted_federation(service: str = "airflow-scheduler") -> Path:
    target = env(service)["CROSSCLOUD_FEDERATION"]
    return ROOT / next(v.split(":")[0] for v in SERVICES[service]["volumes"] if v.split(":")[1] == target)


FED = load_federation(mounted_federation())


def created_databases() -> dict[str, str]:
    """database -> owner, as deploy/postgres-init.sql creates them; Airflow's own is the image's POSTGRES_DB."""
    found = dict(re.findall(r"CREATE DATABASE (\w+) OWNER (\w+);", INIT_SQL))
    pg = SERVICES["postgres"]["environment"]
    return {**found, pg["POSTGRES_DB"]: pg["POSTGRES_USER"]}


def db_user_password(user: str) -> str:
    if user == SERVICES["postgres"]["environment"]["POSTGRES_USER"]:
        return SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"]
    return re.search(rf"CREATE USER {user} WITH PASSWORD '([^']*)';", INIT_SQL).group(1)


def published(service: str, stack: tuple[dict, ...] = (STACK, MAIN_HOST)) -> set[int]:
    """Ports a service publishes at the same number inside, on the main host (docker-compose.yaml and its
    override deploy/compose.main-host.yaml, whose port lists compose appends): a remote worker reaches it there."""
    ports = [p for doc in stack for p in doc["services"].get(service, {}).get("ports", [])]
    pairs = [p.rsplit(":", 2)[-2:] for p in ports]
    return {int(inside) for outside, inside in pairs if outside == inside}


def host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url.removeprefix("db+"))
    return parsed.hostname, parsed.port


def compose_errors(doc: dict) -> list[str]:
    """Errors against the Compose specification schema (the copy check-jsonschema ships, so offline)."""
    text = (importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text()
    schema = json.loads(text)
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_follows_the_compose_specification():
    assert compose_errors(COMPOSE) == []
    assert compose_errors(STACK) == []
    assert compose_errors(yaml.safe_load(MAIN_HOST_TEXT)) == [] and set(MAIN_HOST["services"]) <= set(SERVICES)
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["airflow-scheduler"]["restart_policy"] = "always"  # not a service field
    broken["services"]["postgres"]["ports"] = {"5432": "5432"}  # a mapping where a list belongs
    errors = "\n".join(compose_errors(broken))
    assert "'restart_policy' was unexpected" in errors and "is not of type 'array'" in errors


def test_airflow_3_services_as_in_the_official_compose_file():
    commands = {name: SERVICES[name].get("command") for name in SERVICES}
    assert commands["airflow-apiserver"] == "api-server"
    assert commands["airflow-scheduler"] == "scheduler"
    assert commands["airflow-dag-processor"] == "dag-processor"
    assert commands["airflow-triggerer"] == "triggerer"
    assert "airflow db migrate" in "\n".join(SERVICES["airflow-init"]["command"])
    assert SERVICES["postgres"]["image"].startswith("postgres:")
    assert SERVICES["redis"]["image"].startswith("redis:")
    assert "mlflow server" in SERVICES["mlflow"]["command"]
    assert env("airflow-scheduler")["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", *WORKERS):
        assert SERVICES[name]["depends_on"]["airflow-init"] == {"condition": "service_completed_successfully"}
        assert SERVICES[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
        assert SERVICES[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
        assert SERVICES[name]["healthcheck"]["test"]
    clouds = [server for c in FED.clouds for server in (f"minio-{c.name}", c.access.host)]
    for server in ("postgres", "redis", "mlflow", *clouds):
        assert SERVICES[server]["healthcheck"]["test"], server  # what the depends_on conditions wait for


def test_celery_executor_with_a_redis_broker_and_two_workers_of_their_own_names():
    assert len(WORKERS) == 2 and sorted(WORKERS) == ["airflow-worker-1", "airflow-worker-2"]
    for name in AIRFLOW:
        assert env(name)["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        assert env(name)["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0"
        assert env(name)["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://")
        assert env(name)["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    hostnames = [SERVICES[w]["hostname"] for w in WORKERS]
    assert len(set(hostnames)) == 2
    for worker, hostname in zip(WORKERS, hostnames):
        assert SERVICES[worker]["command"] == ["celery", "worker", "--celery-hostname", f"celery@{hostname}"]
        assert 'ping -d "celery@${HOSTNAME}"' in SERVICES[worker]["healthcheck"]["test"][1]  # its own node
        assert SERVICES[worker]["depends_on"]["airflow-apiserver"] == {"condition": "service_healthy"}
        assert env(worker)["DUMB_INIT_SETSID"] == "0"
    from crosscloud.core import deployment

    deployment.set_executor(env(WORKERS[0])["AIRFLOW__CORE__EXECUTOR"])
    try:
        assert deployment.multi_host()  # the engine sees this stack as several hosts
    finally:
        deployment.set_executor(None)


def test_every_airflow_service_shares_secrets_urls_ledger_and_federation():
    assert len(AIRFLOW) >= 8 and REMOTE in AIRFLOW
    for key in SHARED:
        raw = {COMPOSE["services"][n]["environment"][key] for n in AIRFLOW}
        assert len(raw) == 1 and {env(n)[key] for n in AIRFLOW} == {env(AIRFLOW[0])[key]}, key
        assert env(AIRFLOW[0])[key], key
    connections = {k for k in env(AIRFLOW[0]) if k.startswith("AIRFLOW_CONN_")}
    assert connections and all({k: env(n)[k] for k in connections} == {k: env(AIRFLOW[0])[k] for k in connections}
                               for n in AIRFLOW)
    Fernet(env(AIRFLOW[0])["AIRFLOW__CORE__FERNET_KEY"])  # a valid key, not the empty one
    for name in AIRFLOW:
        assert mounted_federation(name) == mounted_federation()
    api = urlparse(env(AIRFLOW[0])["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (api.hostname, api.path) == ("airflow-apiserver", "/execution/") and api.port in published(api.hostname)
    assert SERVICES[api.hostname]["command"] == "api-server"


def test_the_ledger_has_a_database_of_its_own_on_postgres():
    databases = created_databases()
    url = make_url(env("airflow-scheduler")["CROSSCLOUD_LEDGER_URL"])
    airflow_db = make_url(env("airflow-scheduler")["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert url.drivername == "postgresql+psycopg2" and url.host == "postgres"
    assert url.database in re.findall(r"CREATE DATABASE (\w+)", INIT_SQL)  # made by the init script
    assert url.database != airflow_db.database and url.username != airflow_db.username
    assert databases[url.database] == url.username and db_user_password(url.username) == url.password
    results = make_url(env("airflow-scheduler")["AIRFLOW__CELERY__RESULT_BACKEND"].removeprefix("db+"))
    assert results.database == airflow_db.database
    init = "./deploy/postgres-init.sql:/docker-entrypoint-initdb.d/10-crosscloud.sql:ro"
    assert init in SERVICES["postgres"]["volumes"]


def test_mlflow_runs_on_postgres_with_served_artifacts():
    command = shlex.split(SERVICES["mlflow"]["command"])
    backend = make_url(command[command.index("--backend-store-uri") + 1])
    assert backend.drivername == "postgresql+psycopg2" and backend.host == "postgres"
    assert created_databases()[backend.database] == backend.username == "mlflow"
    assert db_user_password("mlflow") == backend.password
    assert backend.database not in (make_url(env("airflow-scheduler")[k]).database
                                    for k in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "CROSSCLOUD_LEDGER_URL"))
    assert "--serve-artifacts" in command  # every host logs artifacts through the server
    assert env("airflow-scheduler")["CROSSCLOUD_MLFLOW_ARTIFACTS"].startswith("mlflow-artifacts:/")
    assert SERVICES["mlflow"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    tracking = urlparse(env("airflow-scheduler")["MLFLOW_TRACKING_URI"])
    assert tracking.hostname == "mlflow" and str(tracking.port) == command[command.index("--port") + 1]
    # MLflow answers 403 to a Host header it does not allow; every host's client sends this one
    assert tracking.netloc in command[command.index("--allowed-hosts") + 1].split(",")


@pytest.mark.multihost
def test_the_postgres_init_script_gives_the_ledger_and_mlflow_databases_their_owners():
    """deploy/postgres-init.sql run as the image's entrypoint runs it (psql as POSTGRES_USER into POSTGRES_DB) on a
    real PostgreSQL; then the ledger's and MLflow's users create tables in their databases, as their migrations do."""
    pgserver = pytest.importorskip("pgserver")
    import psycopg2

    try:
        server = pgserver.PostgresServer({"fsync": "off"}).start()
    except pgserver.PostgresUnavailable as exc:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(str(exc))
    try:
        pg = SERVICES["postgres"]["environment"]
        conn = psycopg2.connect(host="127.0.0.1", port=server.port, user=server.user, dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:  # what the image does before the init scripts
            cur.execute(f"CREATE USER {pg['POSTGRES_USER']} WITH SUPERUSER")
            cur.execute(f"CREATE DATABASE {pg['POSTGRES_DB']} OWNER {pg['POSTGRES_USER']}")
        conn.close()
        psql = pgserver.binaries() / "psql"
        init = ROOT / "deploy" / "postgres-init.sql"
        done = subprocess.run([str(psql), "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(server.port),
                               "-U", pg["POSTGRES_USER"], "-d", pg["POSTGRES_DB"], "-f", str(init)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        mlflow = shlex.split(SERVICES["mlflow"]["command"])
        for url in (env("airflow-scheduler")["CROSSCLOUD_LEDGER_URL"], mlflow[mlflow.index("--backend-store-uri") + 1]):
            url = make_url(url)
            conn = psycopg2.connect(host="127.0.0.1", port=server.port, user=url.username, dbname=url.database)
            with conn, conn.cursor() as cur:
                cur.execute("CREATE TABLE probe (x int)")  # PostgreSQL 15+: only the owner may, in schema public
                cur.execute("SELECT current_user, current_database()")
                assert cur.fetchone() == (url.username, url.database)
            conn.close()
    finally:
        server.stop()


def test_each_cloud_has_its_s3_server_its_ssh_host_and_no_single_host_access():
    init = SERVICES["minio-init"]["command"][0]
    keys = SERVICES["cloud-keys"]["command"][0]
    minio = sorted(n for n in SERVICES if n.startswith("minio-") and n != "minio-init")
    assert minio == sorted(f"minio-{c.name}" for c in FED.clouds)
    for cloud in FED.clouds:
        # reached alike from every worker: not the local method, not a file:// store
        assert cloud.access.method == "ssh" and cloud.store.url.startswith("s3://"), cloud.name
        endpoint = urlparse(cloud.store.endpoint_url)
        minio = SERVICES[f"minio-{cloud.name}"]
        assert endpoint.hostname == f"minio-{cloud.name}"
        assert f'--address ":{endpoint.port}"' in minio["command"]
        assert minio["environment"]["MC_HOST_local"] == f"http://localhost:{endpoint.port}"  # its healthcheck
        assert SERVICES["minio-init"]["depends_on"][endpoint.hostname] == {"condition": "service_healthy"}
        assert f"mc alias set {cloud.name} {cloud.store.endpoint_url} " in init
        assert f"mc mb --ignore-existing {cloud.name}/{urlparse(cloud.store.url).netloc}\n" in init
        for tenant in (t.name for t in FED.tenants if t.quotas.get(cloud.name)):
            conn_id = cloud.store.connection_id.format(tenant=tenant)
            conn = json.loads(env("airflow-scheduler")["AIRFLOW_CONN_" + conn_id.upper()])
            assert conn["conn_type"] == "aws" and conn["login"] and conn["password"]
        # its host: sshd on access.port with its own host key, the workers' key authorized
        host = SERVICES[cloud.access.host]
        sshd = host["command"]
        assert sshd[sshd.index("-p") + 1] == str(cloud.access.port)
        assert sshd[sshd.index("-h") + 1] == f"/keys/host_{cloud.name}_ed25519"
        assert str(cloud.access.port) in host["healthcheck"]["test"][-1]
        assert cloud.name in re.search(r"for cloud in ([^;]+);", keys).group(1).split()
        for name in DEFAULT:
            assert SERVICES[name]["depends_on"][cloud.access.host] == {"condition": "service_healthy"}
    assert "python /opt/crosscloud/deploy/ssh_connections.py /keys" in SERVICES["airflow-init"]["command"][1]
    assert "airflow connections import /tmp/ssh-connections.json --overwrite" in SERVICES["airflow-init"]["command"][1]


def test_a_worker_on_another_host_reaches_every_server_at_the_main_host():
    """airflow-worker-remote: every server name a worker uses points at the main host, which publishes its port."""
    remote = SERVICES[REMOTE]
    assert remote["profiles"] == ["remote-worker"] and remote["depends_on"] == {}
    assert remote["command"] == ["celery", "worker", "--celery-hostname", f"celery@{remote['hostname']}"]
    assert remote["hostname"] not in [SERVICES[w]["hostname"] for w in WORKERS]
    assert "8793:8793" in remote["ports"]  # the api-server reads its task logs there
    servers = {host_port(env(REMOTE)[k]) for k in SERVER_URLS}
    servers |= {host_port(c.store.endpoint_url) for c in FED.clouds}
    servers |= {(c.access.host, c.access.port) for c in FED.clouds}
    assert set(remote["extra_hosts"]) == {host for host, _ in servers}
    assert set(remote["extra_hosts"].values()) == {"host-gateway"}  # CROSSCLOUD_MAIN_HOST unset
    assert set(COMPOSE["services"][REMOTE]["extra_hosts"].values()) == {"${CROSSCLOUD_MAIN_HOST:-host-gateway}"}
    for host, port in servers:
        assert port in published(host), (host, port)
    ports = [port for host, port in servers]
    assert len(set(ports)) == len(ports)  # one port per server: one address reaches them all
    # on one machine nothing but the UIs is published: the stack takes no port a local PostgreSQL may hold
    assert {n for n in DEFAULT if published(n, (STACK,))} == {"airflow-apiserver"}
    publishing = {n for n, s in SERVICES.items() if s.get("ports") and not s.get("profiles")}
    assert publishing == {"airflow-apiserver", "mlflow"}
    raw = yaml.safe_load(MAIN_HOST_TEXT)["services"]
    assert all(p.startswith("${CROSSCLOUD_PUBLISH_ADDR:-127.0.0.1}:") for s in raw.values() for p in s["ports"])


def _ssh_connections():
    spec = importlib.util.spec_from_file_location("ssh_connections", ROOT / "deploy" / "ssh_connections.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sshd(tmp_path: Path, keys: Path, cloud) -> tuple[subprocess.Popen, int]:
    """The cloud host's sshd command from the file, on a free port of 127.0.0.1, as this user."""
    from s3servers import free_port

    port = free_port()
    args = [a.replace("/keys/", f"{keys}/") for a in SERVICES[cloud.access.host]["command"]]
    args[args.index("-p") + 1] = str(port)
    sftp = next(p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server") if Path(p).exists())
    config = tmp_path / "sshd_config"  # only what a test server needs besides; the file's flags decide the rest
    config.write_text(f"ListenAddress 127.0.0.1\nPidFile {tmp_path / 'sshd.pid'}\nStrictModes no\n"
                      f"Subsystem sftp {sftp}\n")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    with open(tmp_path / "sshd.log", "w") as log:
        proc = subprocess.Popen([*args, "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail(f"sshd did not start: {(tmp_path / 'sshd.log').read_text()[-500:]}")


@pytest.mark.ssh
def test_cloud_hosts_take_the_connections_airflow_init_makes(tmp_path, monkeypatch):
    """cloud-keys' script, a cloud host's sshd flags and deploy/ssh_connections.py, run for real: the Connection
    logs in through the crosscloud connector (SSHHook), with the host key pinned; another cloud's pin is refused."""
    if not Path(SERVICES[FED.clouds[0].access.host]["command"][0]).exists():
        missing = "no sshd here: apt-get install -y openssh-server"
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(missing)
    from airflow.providers.ssh.hooks.ssh import SSHHook
    from crosscloud_airflow.connections import ssh_client

    keys = tmp_path / "keys"
    keys.mkdir()
    script = SERVICES["cloud-keys"]["command"][0].replace("cd /keys", f"cd {keys}")
    subprocess.run(["/bin/sh", "-c", script], check=True)
    subprocess.run(["/bin/sh", "-c", script], check=True)  # a restart keeps the keys
    made = _ssh_connections().connections(FED, keys)
    assert sorted(made) == sorted(c.access.connection_id for c in FED.clouds)
    cloud, other = FED.clouds[0], FED.clouds[1]
    conn = made[cloud.access.connection_id]
    assert (conn["host"], conn["port"], conn["login"]) == (cloud.access.host, cloud.access.port, cloud.access.user)
    proc, port = _sshd(tmp_path, keys, cloud)
    try:
        here = {**conn, "host": "127.0.0.1", "port": port, "login": getpass.getuser()}
        access = {**cloud.access.model_dump(), "host": "127.0.0.1"}
        monkeypatch.setenv(f"AIRFLOW_CONN_{cloud.access.connection_id.upper()}", json.dumps(here))
        client = ssh_client(cloud.name, access)
        _, out, _ = client.exec_command("echo logged-in")
        assert out.read().decode().strip() == "logged-in"
        client.open_sftp().close()  # the ssh backend copies files over SFTP
        client.close()
        pinned_wrong = {**here, "extra": made[other.access.connection_id]["extra"]}
        monkeypatch.setenv(f"AIRFLOW_CONN_{cloud.access.connection_id.upper()}", json.dumps(pinned_wrong))
        with pytest.raises(Exception, match="(?i)host key"):  # the hook itself: one attempt, not three
            SSHHook(ssh_conn_id=cloud.access.connection_id, remote_host="127.0.0.1", conn_retry_attempts=1).get_conn()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_dockerfile_builds_what_compose_and_the_federations_name():
    stages = re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert stages == ["airflow", "worker-base", "cloud-host", "worker"]  # the worker image is the default (last) target
    assert {s["build"]["target"] for s in SERVICES.values() if "build" in s} == {"airflow", "cloud-host"}
    assert "FROM worker-base AS cloud-host" in DOCKERFILE and "FROM worker-base AS worker" in DOCKERFILE
    cloud_host = DOCKERFILE.split("AS cloud-host", 1)[1].split("\nFROM ", 1)[0]
    assert "openssh-server" in cloud_host and "/etc/ssh/ssh_host_*" in cloud_host  # no host key baked in
    assert "useradd --create-home --uid 10001 crosscloud" in DOCKERFILE
    assert DOCKERFILE.count("ARG BASE=python:3.11-slim") == 1  # whose interpreter is /usr/local/bin/python
    for cloud in FED.clouds:
        assert (cloud.access.user, cloud.access.python) == ("crosscloud", "/usr/local/bin/python")
        assert cloud.access.workdir.startswith("/home/crosscloud/")
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
