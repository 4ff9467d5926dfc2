"""TrainConfig: the learning-rate schedule, and a config checks itself when built."""

from __future__ import annotations

import pytest

from mygpt.errors import UserError
from mygpt.training.config import TrainConfig, lr_at


def test_lr_schedule_matches_chapter_figures():
    cfg = TrainConfig(steps=10_000, lr=1e-3, schedule="cosine", warmup=500)
    assert f"{lr_at(cfg, 1):.2e}" == "2.00e-06"
    assert f"{lr_at(cfg, 50):.2e}" == "1.00e-04"
    assert f"{lr_at(cfg, 500):.2e}" == "1.00e-03"
    assert f"{lr_at(cfg, 1000):.2e}" == "9.93e-04"
    assert f"{lr_at(cfg, 5000):.2e}" == "5.41e-04"
    assert f"{lr_at(cfg, 10_000):.2e}" == "0.00e+00"
    const = TrainConfig(steps=100, lr=3e-4, schedule="constant", warmup=10)
    assert lr_at(const, 5) == pytest.approx(1.5e-4)
    assert lr_at(const, 10) == lr_at(const, 100) == pytest.approx(3e-4)
    assert lr_at(TrainConfig(lr=1e-3), 1) == 1e-3


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"steps": 0}, r"^steps must be an integer >= 1, got 0$"),
        ({"schedule": "linear"}, r"^schedule must be one of constant, cosine; got 'linear'$"),
        ({"precision": "fp16"}, r"^precision must be one of auto, fp32, bf16; got 'fp16'$"),
        ({"compile": "yes"}, r"^compile must be true or false, got 'yes'$"),
        ({"lr": float("inf")}, r"^lr must be a positive number, got inf$"),
        ({"max_grad_norm": -1.0}, r"^max_grad_norm must be >= 0 \(0 = no clipping\), got -1.0$"),
    ],
)
def test_a_config_checks_itself(fields, message):
    with pytest.raises(UserError, match=message):
        TrainConfig(**fields)


def test_from_dict_names_unknown_fields():
    assert TrainConfig.from_dict({"steps": 3}) == TrainConfig(steps=3)
    with pytest.raises(UserError, match=r"^job 'train' has unknown TrainConfig field\(s\) \['epochs'\]"):
        TrainConfig.from_dict({"epochs": 3}, "job 'train'")
