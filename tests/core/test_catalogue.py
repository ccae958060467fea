"""The built-in instance-type catalogue (docs/model.md rule 1.6) and a configuration's
``instance_types``, which extends and overrides it."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

from airflow_quota.core.catalogue import builtin_catalogue, catalogue_source
from airflow_quota.core.config import parse_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Entry, JobRequest, Placed
from airflow_quota.exceptions import InvalidInput
from airflow_quota.sim.report import build_report
from airflow_quota.sim.simulator import Simulator
from tests.builders import job, quota, scenario, share

GPU_FAMILIES = ["ml.g4dn", "ml.g5", "ml.g6", "ml.g6e", "ml.p3", "ml.p4d", "ml.p4de", "ml.p5", "ml.p5e", "ml.trn1"]
CPU_FAMILIES = ["ml.c5", "ml.m5"]


def family(family_name: str) -> dict[str, Any]:
    """The catalogue's types of one family: ``ml.p4d`` is ml.p4d.*, not ml.p4de.*."""
    return {name: spec for name, spec in builtin_catalogue().items() if name.startswith(family_name + ".")}


@pytest.mark.parametrize("family_name", GPU_FAMILIES + CPU_FAMILIES, ids=lambda f: f"the catalogue has {f}")
def test_every_family_the_product_names_is_present(family_name: str) -> None:
    assert family(family_name), f"no {family_name}.* type in the packaged catalogue"


@pytest.mark.parametrize("family_name", GPU_FAMILIES, ids=lambda f: f"{f} is accelerated with at least one GPU")
def test_gpu_families_are_accelerated(family_name: str) -> None:
    for name, spec in family(family_name).items():
        assert spec.is_accelerated(name), name
        assert spec.gpus >= 1, name


@pytest.mark.parametrize("family_name", CPU_FAMILIES, ids=lambda f: f"{f} is CPU-only, not accelerated")
def test_cpu_families_are_not_accelerated(family_name: str) -> None:
    for name, spec in family(family_name).items():
        assert not spec.is_accelerated(name), name
        assert spec.gpus == 0, name


def test_every_price_is_positive() -> None:
    catalogue = builtin_catalogue()
    assert len(catalogue) >= len(GPU_FAMILIES) + len(CPU_FAMILIES)
    assert [name for name, spec in catalogue.items() if not spec.hourly_price > 0] == []


def test_catalogue_names_its_source_and_date() -> None:
    source = catalogue_source()
    assert source["source"].startswith("https://"), source
    assert source["region"]
    date.fromisoformat(source["as_of"])  # a real date, not just any text


@pytest.mark.parametrize(
    ("name", "accelerated"),
    [
        ("ml.p9.fake", True),
        ("ml.g9.fake", True),
        ("ml.trn9.fake", True),
        ("ml.inf9.fake", True),
        ("ml.c9.fake", False),
        ("ml.m9.fake", False),
        ("ml.r9.fake", False),
        ("ml.t9.fake", False),
    ],
    ids=lambda v: v if isinstance(v, str) else ("is accelerated by default" if v else "is not accelerated by default"),
)
def test_accelerated_defaults_from_the_family(name: str, accelerated: bool) -> None:
    config = parse_config(
        {
            "instance_types": {name: {"gpus": 0, "hourly_price": 1.0}},
            "pool": {"capacity": {name: 1}},
            "shares": [{"name": "s", "capacity_limits": {name: 1}}],
        }
    )
    assert config.catalogue()[name].is_accelerated(name) is accelerated


# -- a configuration's instance_types ---------------------------------------------------

GPU_NODE = {"gpus": 8, "accelerator": "H100", "accelerated": True, "hourly_price": 98.32}


def gpu_node_quota() -> dict[str, Any]:
    raw = quota({"gpu-node": 2, "ml.g5.xlarge": 1}, share("team", {"gpu-node": 2, "ml.g5.xlarge": 1}, "RESERVE"))
    raw["instance_types"] = {"gpu-node": GPU_NODE}
    return raw


def test_a_custom_type_extends_the_catalogue() -> None:
    catalogue = parse_config(gpu_node_quota()).catalogue()
    assert catalogue["gpu-node"].gpus == 8
    assert catalogue["gpu-node"].is_accelerated("gpu-node")
    assert catalogue["ml.g5.xlarge"] == builtin_catalogue()["ml.g5.xlarge"]  # the rest is still there
    assert "gpu-node" not in builtin_catalogue()  # the packaged catalogue is not changed


def test_a_custom_type_is_unknown_without_instance_types() -> None:
    raw = gpu_node_quota()
    del raw["instance_types"]
    with pytest.raises(InvalidInput) as error:
        parse_config(raw)
    assert any("gpu-node" in p.path and "unknown instance type" in p.message for p in error.value.problems)


def test_a_custom_type_is_usable_in_a_pool() -> None:
    scheduler = QuotaScheduler(parse_config(gpu_node_quota()))
    request = JobRequest.model_validate(
        {"name": "big", "share": "team", "preferences": [{"instance_type": "gpu-node", "count": 2}]}
    )
    scheduler.submit(request, 0)
    decisions = scheduler.run_cycle(0)
    assert [(type(d), d.job, d.entry) for d in decisions if isinstance(d, Placed)] == [
        (Placed, "big", Entry("gpu-node", 2))
    ]
    assert scheduler.state.types["gpu-node"].gpus == 8


def test_a_custom_type_is_charged_its_gpus_and_price() -> None:
    loaded = scenario(gpu_node_quota(), job("big", "team", ("gpu-node", 1), duration=3600))
    report = build_report(Simulator(loaded).run())
    assert report["jobs"]["big"]["gpu_hours"] == 8
    assert report["jobs"]["big"]["cost"] == pytest.approx(98.32)


def _g5_cost(instance_types: dict[str, Any] | None) -> float:
    raw = quota({"ml.g5.xlarge": 1}, share("team", {"ml.g5.xlarge": 1}, "RESERVE"))
    if instance_types is not None:
        raw["instance_types"] = instance_types
    loaded = scenario(raw, job("j", "team", ("ml.g5.xlarge", 1), duration=3600))
    cost: float = build_report(Simulator(loaded).run())["jobs"]["j"]["cost"]
    return cost


def test_an_override_changes_a_simulated_jobs_cost() -> None:
    builtin_price = builtin_catalogue()["ml.g5.xlarge"].hourly_price
    assert _g5_cost(None) == pytest.approx(builtin_price)
    assert builtin_price != 2.5
    assert _g5_cost({"ml.g5.xlarge": {"gpus": 1, "hourly_price": 2.5}}) == pytest.approx(2.5)


def test_an_override_changes_gpus_too() -> None:
    raw = quota({"ml.g5.xlarge": 1}, share("team", {"ml.g5.xlarge": 1}, "RESERVE"))
    raw["instance_types"] = {"ml.g5.xlarge": {"gpus": 4, "hourly_price": 1.0}}
    report = build_report(Simulator(scenario(raw, job("j", "team", ("ml.g5.xlarge", 1), duration=1800))).run())
    assert report["jobs"]["j"]["gpu_hours"] == 2
