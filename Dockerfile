# syntax=docker/dockerfile:1
# Images built from this package, every version pinned by constraints.txt.
#
#   worker (the default target): the sub-task image a remote cloud runs - the engine and its
#   training worker, no Airflow. VARIANT=cpu installs PyTorch's CPU wheel; VARIANT=cuda the
#   PyPI wheel, which carries its CUDA runtime (the node needs the NVIDIA driver and device plugin).
#     docker build -t crosscloud-worker:cpu .
#     docker build --build-arg VARIANT=cuda -t crosscloud-worker:cuda .
#   Ascend (CANN) and Hygon (DTK) images start from the vendor's PyTorch image instead:
#     docker build --build-arg BASE=<vendor image with python3.11 and torch> --build-arg VARIANT=vendor ...
#   and are registered per accelerator type under `images:` in the federation file.
#
#   airflow: Airflow with crosscloud's DAGs, plugins and engine, for docker-compose.yaml.
#     docker build --target airflow -t crosscloud-airflow .
#   cloud-host: the worker's environment behind OpenSSH, a stand-in for a bare-metal cloud that
#   docker-compose.yaml reaches with the ssh access method (one container per cloud).
#     docker build --target cloud-host -t crosscloud-cloud-host .

ARG BASE=python:3.11-slim-bookworm
ARG AIRFLOW_BASE=apache/airflow:3.3.2-python3.11

FROM ${AIRFLOW_BASE} AS airflow
COPY --chown=airflow:0 requirements.txt constraints.txt /opt/crosscloud/
# the local clouds' sub-tasks run beside the scheduler on CPU: PyTorch's CPU wheel, then the rest as pinned
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "$(grep -i '^torch==' /opt/crosscloud/constraints.txt)" \
    && pip install --no-cache-dir -r /opt/crosscloud/requirements.txt -c /opt/crosscloud/constraints.txt
COPY --chown=airflow:0 pyproject.toml README.md /opt/crosscloud/
COPY --chown=airflow:0 include /opt/crosscloud/include
COPY --chown=airflow:0 plugins /opt/crosscloud/plugins
RUN pip install --no-cache-dir --no-deps /opt/crosscloud
COPY --chown=airflow:0 dags /opt/airflow/dags

# what the worker image and the compose stack's cloud hosts share
FROM ${BASE} AS worker-base
ARG VARIANT=cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/crosscloud
COPY constraints.txt ./
# torch first: the variant decides the wheel; the rest of the worker's imports as pinned
RUN set -eux; \
    torch="$(grep -i '^torch==' constraints.txt)"; \
    case "$VARIANT" in \
      cpu)  pip install --index-url https://download.pytorch.org/whl/cpu "$torch" ;; \
      cuda) pip install "$torch" ;; \
      vendor) python -c "import torch" ;; \
      *) echo "VARIANT must be cpu, cuda or vendor, not $VARIANT" >&2; exit 1 ;; \
    esac; \
    pip install -c constraints.txt safetensors boto3 pydantic PyYAML psutil fastcdc numpy
COPY pyproject.toml README.md ./
COPY include ./include
COPY plugins ./plugins
RUN pip install --no-deps . && python -c "import torch, crosscloud.training.worker" \
    && useradd --create-home --uid 10001 crosscloud

# sshd runs as root and takes its host key and port on the command line (docker-compose.yaml);
# sub-tasks run as crosscloud: access.python /usr/local/bin/python, access.workdir in its home
FROM worker-base AS cloud-host
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server \
    && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \
    && mkdir -p /run/sshd && usermod -p '*' crosscloud
# no host keys baked in (each cloud host gets its own); '*': key login only, the account is not locked
CMD ["/usr/sbin/sshd", "-D", "-e"]

FROM worker-base AS worker
USER crosscloud
# the command comes from the backend (torchrun or python -m crosscloud.training.worker ...)
CMD ["python", "-m", "crosscloud.training.worker", "--help"]
