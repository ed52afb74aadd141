"""Names that become parts of object keys (tenants, runs, clouds) and the key layout.

Every key of the exchange protocol is built here, from validated names, so that
no name can climb out of its tenant's prefix (``..``, ``/``, absolute paths).
"""

from __future__ import annotations

import re

PARAMS = "params.safetensors"  # a global's parameters, the one object every commit of a global holds
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")


def validate_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it is safe as one path segment, else raise ValueError naming ``what``."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:  # fullmatch: "$" lets "\n" through
        raise ValueError(
            f"{what} {value!r} is not allowed: use 1-128 letters, digits and _ . : + - "
            "starting with a letter or digit, without '..' or '/'"
        )
    return value


class RunKeys:
    """The object keys of one run of one tenant (DESIGN.md, exchange protocol)."""

    def __init__(self, tenant: str, run_id: str):
        self.tenant = validate_name(tenant, "tenant")
        self.run_id = validate_name(run_id, "run id")
        self.root = f"{self.tenant}/runs/{self.run_id}"

    @property
    def plan(self) -> str:
        return f"{self.root}/plan.json"

    @property
    def history(self) -> str:
        return f"{self.root}/history.json"

    @property
    def summary(self) -> str:
        return f"{self.root}/summary.json"

    @property
    def stop(self) -> str:
        return f"{self.root}/STOP"

    @property
    def lease(self) -> str:
        """The run's lease as the control plane last renewed it, in every cloud's store (``run.heartbeat``)."""
        return f"{self.root}/lease.json"

    def global_step(self, round_: int) -> str:
        return f"{self.root}/global/{int(round_)}"

    def cloud_step(self, cloud: str, round_: int) -> str:
        return f"{self.root}/clouds/{validate_name(cloud, 'cloud')}/{int(round_)}"

    def cloud_state(self, cloud: str, round_: int) -> str:
        """A cloud's own training state after ``round_``: what its sub-task resumes from after a restart."""
        return f"{self.root}/state/{validate_name(cloud, 'cloud')}/{int(round_)}"

    def sdk_started(self, cloud: str) -> str:
        """Written when a cloud's program first calls the SDK: a stalled run can tell a program that never did."""
        return f"{self.root}/state/{validate_name(cloud, 'cloud')}/sdk-started.json"

    def sdk_finished(self, cloud: str) -> str:
        """Written when a cloud's sub-task has committed its last round: what it spent after that round's commit."""
        return f"{self.root}/state/{validate_name(cloud, 'cloud')}/sdk-finished.json"

    def members(self, round_: int) -> str:
        """Who is in round ``round_`` and what it decided, written once in the home store by the first cloud to know."""
        return f"{self.root}/rounds/{int(round_)}/MEMBERS.json"


    def evaluation(self, global_: int) -> str:
        """The held-out loss of global ``global_``, written by the cloud that evaluated it."""
        return f"{self.root}/rounds/eval/{int(global_)}.json"

    def paused(self, cloud: str) -> str:
        """A cloud's sub-task stopped for the run's pause (which one, after which round), in the home store."""
        return f"{self.root}/rounds/paused/{cloud}.json"

    @property
    def watch(self) -> str:
        """What the watcher (Airflow) knows and the clouds cannot: sub-tasks ended or restarted, clouds draining."""
        return f"{self.root}/rounds/watch.json"

    @property
    def final(self) -> str:
        return f"{self.root}/final"


def manifest_key(tenant: str, digest: str) -> str:
    """Where the manifest of the artifact with this sha256 lives in a cloud's store."""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return f"{validate_name(tenant, 'tenant')}/artifacts/{digest}.json"
