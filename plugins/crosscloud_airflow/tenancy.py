"""Which crosscloud tenants a signed-in Airflow user may see: the one rule of every route of the page.

A crosscloud tenant is the Airflow team of the same name, and whether a user
belongs to it is the auth manager's answer (``is_authorized_team``, through
``filter_authorized_teams``), so whichever auth manager Airflow runs (Simple,
FAB, Keycloak) decides: an administrator is in every team, anyone else in the
teams of their user record or roles. Airflow's own ``multi_team`` mode gives
users teams; without it (or with an auth manager that knows no teams) only an
administrator's auth manager may still answer yes, and everyone else sees no
tenant and is told why.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow.api_fastapi.app import get_auth_manager
from fastapi import HTTPException

NO_TENANT = (
    "You are signed in as {user}, who is in no crosscloud tenant's Airflow team{why}, so no tenant's runs, "
    "reservations or quota are shown. Ask an Airflow administrator to add you to the Airflow team named after "
    "your tenant ({tenants})."
)


def visible_tenants(user, tenants: Iterable[str], auth_manager=None) -> tuple[list[str], str]:
    """(the tenants of ``tenants`` that ``user`` may see, in their order; why none when there are none)."""
    auth_manager = auth_manager or get_auth_manager()
    names = list(tenants)
    try:
        allowed = auth_manager.filter_authorized_teams(teams_names=set(names), user=user, method="GET")
        why = ""
    except NotImplementedError:  # an auth manager without teams: nobody is shown a tenant
        allowed, why = set(), f" (the auth manager {type(auth_manager).__name__} knows no teams)"
    shown = [n for n in names if n in allowed]
    return shown, "" if shown else NO_TENANT.format(user=user.get_name(), why=why, tenants=", ".join(names))


def require_tenant(user, tenant: str, auth_manager=None) -> None:
    """Refuse (403, without naming the tenant) a run of a tenant the user may not see."""
    if not visible_tenants(user, [tenant], auth_manager)[0]:
        raise HTTPException(403, "this run belongs to a crosscloud tenant whose Airflow team you are not in")
