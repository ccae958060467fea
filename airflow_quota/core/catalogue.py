"""The built-in catalogue of SageMaker training instance types (GPUs, accelerator, price).

The data lives in ``data/instance_types.yaml`` with its source and date; a configuration's
``instance_types`` section extends or overrides it.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

ACCELERATED_FAMILIES = ("ml.p", "ml.g", "ml.trn", "ml.inf")


class InstanceTypeSpec(BaseModel):
    """What the scheduler needs to know of an instance type (finite numbers: a configuration
    is stored as JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    gpus: int = Field(ge=0, strict=True, description="GPUs (or accelerator chips) per instance")
    accelerator: str | None = None
    accelerated: bool | None = Field(
        default=None, description="defaults from the family: ml.p*, ml.g*, ml.trn*, ml.inf* are"
    )
    vcpus: int | None = Field(default=None, ge=1)
    memory_gib: float | None = Field(default=None, gt=0)
    hourly_price: float = Field(default=0.0, ge=0, description="on-demand USD per instance-hour")

    def is_accelerated(self, name: str) -> bool:
        if self.accelerated is not None:
            return self.accelerated
        return name.startswith(ACCELERATED_FAMILIES)


@lru_cache(maxsize=1)
def builtin_catalogue() -> dict[str, InstanceTypeSpec]:
    """The packaged catalogue, keyed by instance type name."""
    text = resources.files("airflow_quota.core").joinpath("data/instance_types.yaml").read_text()
    raw: dict[str, Any] = yaml.safe_load(text)
    return {name: InstanceTypeSpec(**spec) for name, spec in raw["instance_types"].items()}


def catalogue_source() -> dict[str, str]:
    """Where the packaged prices come from, and when they were read."""
    text = resources.files("airflow_quota.core").joinpath("data/instance_types.yaml").read_text()
    raw = yaml.safe_load(text)
    return {"source": str(raw["source"]), "region": str(raw["region"]), "as_of": str(raw["prices_as_of"])}
