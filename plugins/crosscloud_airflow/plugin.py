"""Registers crosscloud's page with Airflow: the FastAPI app and where the UI shows it.

The app is mounted at ``/crosscloud``; the external views put it in the
navigation (*Browse -> Cross-cloud compute*) and as a tab *Cross-cloud* of
every DAG run (a run that has no crosscloud plan says so), both embedded in
the Airflow UI.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from crosscloud_airflow.ui import app


class CrossCloudPlugin(AirflowPlugin):
    name = "crosscloud"
    fastapi_apps = [{"app": app, "url_prefix": "/crosscloud", "name": "crosscloud"}]
    external_views = [
        {"name": "Cross-cloud compute", "href": "crosscloud/", "destination": "nav", "category": "browse",
         "url_route": "crosscloud"},
        {"name": "Cross-cloud", "href": "crosscloud/runs/{DAG_ID}/{RUN_ID}", "destination": "dag_run",
         "url_route": "crosscloud-run"},
    ]
