"""The errors a user can fix: shown as their message and the fix, never retried, a traceback only on request.

A bad program, federation file, job parameter, dataset or cloud name, a
placement no cloud can take, missing credentials, a deployment that needs
another ledger: retrying changes nothing and a traceback hides the one line
that says what to change. The command line prints them alone (``--debug``
adds the traceback); the DAGs fail the task at once with the message.
"""

from __future__ import annotations

from crosscloud.core.deployment import SingleHostOnly
from crosscloud.core.federation import FederationError
from crosscloud.core.job import JobSpecError
from crosscloud.ledger import ReservationError
from crosscloud.pool.placement import PlacementError
from crosscloud.store.credentials import CredentialsError
from crosscloud.training.program import ProgramError

USER_ERRORS: tuple[type[Exception], ...] = (ProgramError, FederationError, JobSpecError, PlacementError,
                                            CredentialsError, ReservationError, SingleHostOnly)
