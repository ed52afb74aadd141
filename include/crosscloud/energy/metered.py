"""A cloud's measured power from the Prometheus HTTP API (``/api/v1/query``), e.g. DCGM's GPU power.

Modelled power says what a cut should save; only a meter says that it did.
"""

from __future__ import annotations

import json
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode
from urllib.request import urlopen

from crosscloud.core.federation import PowerMetrics


class MetricsError(RuntimeError):
    """The metrics source could not give the cloud's power."""


def measured_power_w(spec: PowerMetrics, timeout_s: float = 10.0) -> float:
    """The cloud's draw now, in watts: the query's samples summed."""
    url = f"{spec.prometheus_url.rstrip('/')}/api/v1/query?{urlencode({'query': spec.query})}"
    where = f"{spec.prometheus_url} query {spec.query!r}"
    try:
        with urlopen(url, timeout=timeout_s) as response:
            body = json.load(response)
    except HTTPError as e:  # Prometheus answers a bad query with 4xx and its reason in the JSON body
        try:
            body = json.load(e)
        except ValueError:
            raise MetricsError(f"{where}: cannot read the power: {e}") from e
    except (URLError, OSError, ValueError) as e:
        raise MetricsError(f"{where}: cannot read the power: {e}") from e
    if body.get("status") != "success":
        raise MetricsError(f"{where}: {body.get('errorType', 'error')}: {body.get('error', body)}")
    data = body.get("data", {})
    if data.get("resultType") == "scalar":
        return float(data["result"][1])
    if data.get("resultType") != "vector" or not data.get("result"):
        raise MetricsError(f"{where}: no samples (is the exporter scraped, and does the query match its series?)")
    return sum(float(sample["value"][1]) for sample in data["result"])
