"""How every stage finds a run: the federation file and its digest, the tenant and the run id, small enough for XCom."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from crosscloud.core.federation import Federation, FederationError, read_federation
from crosscloud.run.plan import Plan
from crosscloud.store.open_store import open_store


class FederationMismatch(FederationError):
    """A host whose federation file is not the one the run was admitted with."""


@dataclass(frozen=True)
class RunRef:
    """How every stage finds a run: small enough to pass through XCom.

    Stages of one run may run on different hosts; each reads the federation
    file where it runs, and ``federation_sha256`` (the admitted file's digest)
    makes sure that every host acts on the same federation.
    """

    federation_path: str
    tenant: str
    run_id: str
    federation_sha256: str = ""  # empty: a reference made outside a DAG run, not checked

    def to_dict(self) -> dict:
        return asdict(self)

    def federation(self) -> Federation:
        fed, digest = read_federation(self.federation_path)
        if self.federation_sha256 and digest != self.federation_sha256:
            raise FederationMismatch(
                f"run {self.run_id} was admitted with federation sha256 {self.federation_sha256[:12]}, but "
                f"{self.federation_path} on this host has {digest[:12]}: deploy the same federation file on every "
                "host (docs/deploying.md), or start a new run")
        return fed

    def load(self) -> tuple[Federation, Plan]:
        fed = self.federation()
        return fed, Plan.load(open_store(fed.local_cloud, self.tenant), self.tenant, self.run_id)
