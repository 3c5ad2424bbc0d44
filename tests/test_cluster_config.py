"""The `cluster:` settings section and `playhead serve --replicas N` (no Ray needed)."""

from __future__ import annotations

import pytest

from app.cli import _load, _parser
from app.settings import SettingsError, load_settings


def test_replicas_flag_sets_the_cluster_section() -> None:
    args = _parser().parse_args(["serve", "--config", "configs/sim.yaml", "--replicas", "3"])
    settings, _ = _load(args)
    assert settings.cluster.replicas == 3
    assert settings.cluster.router == "slack"


def test_no_flag_means_no_cluster() -> None:
    settings, _ = _load(_parser().parse_args(["serve", "--config", "configs/sim.yaml"]))
    assert settings.cluster.replicas == 0


def test_cluster_knobs_from_env_and_set() -> None:
    settings = load_settings(
        None,
        ["cluster.router=default", "cluster.num_cpus_per_replica=0.5"],
        environ={"PLAYHEAD_CLUSTER__RAY_ADDRESS": "ray://head:10001"},
    )
    assert settings.cluster.router == "default"
    assert settings.cluster.num_cpus_per_replica == 0.5
    assert settings.cluster.ray_address == "ray://head:10001"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("cluster.replicas=-1", "cluster.replicas"),
        ("cluster.router=random", "cluster.router"),
        ("cluster.num_cpus_per_replica=0", "cluster.num_cpus_per_replica"),
        ("cluster.stats_period_s=0", "cluster.stats_period_s"),
        ("cluster.replica=2", "cluster.replica"),
    ],
)
def test_invalid_cluster_settings_name_the_field(override: str, field: str) -> None:
    with pytest.raises(SettingsError, match=field.replace(".", r"\.")):
        load_settings(None, [override], environ={})


def test_a_blank_ray_address_is_refused(tmp_path) -> None:
    path = tmp_path / "blank.yaml"
    path.write_text('cluster:\n  ray_address: "  "\n', encoding="utf-8")
    with pytest.raises(SettingsError, match=r"cluster\.ray_address"):
        load_settings(path, [], environ={})
