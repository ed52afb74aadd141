"""What each program costs, as its runs measured it: kept in the ledger, read by admission's sizing.

One row per tenant, program (code sha256), architecture and accelerator
type; a run of the same program and model overwrites it with its own
measurement and counts itself. Tenants never read each other's rows.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from crosscloud.ledger import engine as backend
from crosscloud.ledger.schema import program_figures as F


@dataclass(frozen=True)
class Figure:
    """One program's model on one accelerator type, as a run measured it."""

    tenant: str
    program: str
    architecture: str
    accelerator: str
    parameters: int
    seconds_per_sample: float  # device-seconds per sample, on a device of relative speed 1 for its family
    peak_memory_gb: float  # the largest peak of one rank
    batch: int  # that rank's samples per step
    runs: int = 1
    measured_at: float = 0.0
    run_id: str = ""
    name: str = ""  # the program as the run named it (a path or package.module)


class FigureStore:
    """The ledger's ``program_figures``."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def record(self, figure: Figure) -> None:
        """Keep ``figure`` as the program's newest measurement there, counting the runs that measured it."""
        values = {**asdict(figure), "measured_at": figure.measured_at or time.time()}
        dialect = postgresql if backend.is_postgres(self.engine) else sqlite
        stmt = dialect.insert(F).values(**values)
        keys = ["tenant", "program", "architecture", "accelerator"]
        update = {k: stmt.excluded[k] for k in values if k not in keys and k != "runs"}
        stmt = stmt.on_conflict_do_update(index_elements=keys, set_={**update, "runs": F.c.runs + 1})
        with backend.write(self.engine, lock=False) as db:
            db.execute(stmt)

    def lookup(self, tenant: str, program: str, architecture: str) -> dict[str, Figure]:
        """The measured figures of one program's model, by accelerator type."""
        query = sa.select(F).where(F.c.tenant == tenant, F.c.program == program, F.c.architecture == architecture)
        with backend.read(self.engine) as db:
            return {r.accelerator: Figure(**r._mapping) for r in db.execute(query)}

    def of_tenant(self, tenant: str) -> list[Figure]:
        """Every figure the tenant's runs measured, newest first (what ``crosscloud inventory`` shows)."""
        query = sa.select(F).where(F.c.tenant == tenant).order_by(F.c.measured_at.desc())
        with backend.read(self.engine) as db:
            return [Figure(**r._mapping) for r in db.execute(query)]
