"""MLflow logging (`logger=mlflow`, beside the CSV logger) to a local SQLite store (MLflow's
file store is frozen), no server: `mlflow ui --backend-store-uri sqlite:///logs/mlflow.db`
shows every run. The MLflow experiment is the run's group, the MLflow run name its name, and
its tags the run's tags and choices (attnlab.logger.naming); the config goes in as
parameters."""

from __future__ import annotations

from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger

from attnlab.logger.naming import RunLabels
from attnlab.logger.storage import writable_database


class MLflowLogger(LightningMLFlowLogger):
    def __init__(
        self, database: str, group: str | None, name: str | None, job_type: str, tags: list[str]
    ) -> None:
        run = RunLabels(group, name, job_type, tags)
        store = writable_database(database, "logger.mlflow.database")
        super().__init__(
            experiment_name=run.run_group or "attnlab",
            run_name=run.run_name,
            tracking_uri=f"sqlite:///{store}",
            # a tag is a key and a value: pe=rope as pe: rope, a plain tag with no value
            tags={key: value for key, _, value in (tag.partition("=") for tag in run.all_tags)},
        )
