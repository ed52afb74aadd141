"""How every stage finds a run: the federation file, the tenant and the run id, small enough for XCom."""

from __future__ import annotations

from dataclasses import dataclass

from crosscloud.core.federation import Federation, load_federation
from crosscloud.run.plan import Plan
from crosscloud.store.open_store import open_store


@dataclass(frozen=True)
class RunRef:
    """How every stage finds a run: small enough to pass through XCom."""

    federation_path: str
    tenant: str
    run_id: str

    def to_dict(self) -> dict:
        return {"federation_path": self.federation_path, "tenant": self.tenant, "run_id": self.run_id}

    def load(self) -> tuple[Federation, Plan]:
        fed = load_federation(self.federation_path)
        return fed, Plan.load(open_store(fed.local_cloud, self.tenant), self.tenant, self.run_id)
