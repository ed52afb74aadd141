"""
### Cross-cloud training

One training job split over several sovereign clouds that train together;
the stages are described on the DAG's page (``crosscloud_airflow.training_dag``).
This file defines the DAG shared by every tenant. In Airflow's multi-team mode
it defines none: each tenant's team has its own ``cross_cloud_training__<tenant>``
in a bundle of its own (``crosscloud-airflow tenant-bundles``), so that its
runs, logs and XCom are its team's alone.
"""

from __future__ import annotations

from crosscloud_airflow.training_dag import multi_team, training_dag

if not multi_team():
    training_dag()
