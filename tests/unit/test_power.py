"""Power model: the fit from the DVFS sweep and the effective device-hour price."""

from __future__ import annotations

import pytest

from crosscloud.energy.power import device_power, effective_price, energy_price_per_device_hour, fit_power_curve

SWEEP = """Workload,GPU power cap,throughput,total GPU power,normalized throughput,power per GPU
train_a,100,1,1,0.2,100
train_a,200,1,1,0.8,190
train_a,400,1,1,1.0,380
train_b,100,1,1,0.3,100
train_b,200,1,1,0.7,200
train_b,400,1,1,1.0,400
infer_c,100,1,1,0.9,100
infer_c,400,1,1,1.0,400
"""


@pytest.fixture
def curve(tmp_path):
    path = tmp_path / "sweep.csv"
    path.write_text(SWEEP)
    return fit_power_curve(path)


def test_fit_averages_training_workloads(curve):
    assert curve.workloads == ("train_a", "train_b")
    assert curve.caps == (0.25, 0.5, 1.0)
    assert curve.throughput_at(0.25) == pytest.approx(0.25)
    assert curve.throughput_at(0.5) == pytest.approx(0.75)
    assert curve.throughput_at(0.75) == pytest.approx(0.875)  # piecewise-linear between measured caps
    assert curve.power_at(0.5) == pytest.approx((190 / 380 + 200 / 400) / 2)


def test_endpoints_and_monotone(curve):
    assert curve.throughput_at(1.0) == 1.0 and curve.power_at(1.0) == 1.0
    assert curve.throughput_at(0.0) == 0.0
    xs = [i / 100 for i in range(0, 101)]
    ys = [curve.throughput_at(x) for x in xs]
    assert all(b >= a for a, b in zip(ys, ys[1:]))


def test_cap_for_power_inverts_power_at(curve):
    for f in (0.3, 0.5, 0.7, 0.9):
        assert curve.power_at(curve.cap_for_power(f)) == pytest.approx(f)
    assert curve.cap_for_power(1.0) == 1.0


def test_sweep_fit_follows_the_measured_points():
    curve = fit_power_curve()  # $CROSSCLOUD_DATA_DIR/power/dvfs_sweep.csv: the tests' hand-made sweep (conftest)
    assert curve.workloads == ("ft_synthetic",)  # training workloads only: inference is fitted apart
    assert curve.throughput_at(250 / 400) == pytest.approx(0.88)
    assert curve.power_at(250 / 400) == pytest.approx(230 / 320)
    assert curve.throughput_at(1.0) == 1.0
    ys = [curve.throughput_at(x / 20) for x in range(21)]
    assert all(b >= a for a, b in zip(ys, ys[1:]))


def test_effective_price_hand_computed():
    # 700 W at 100 USD/MWh with PUE 1.5: 0.7 kW * 0.1 USD/kWh * 1.5 = 0.105 USD per device-hour
    assert energy_price_per_device_hour(700, 100.0, 1.5) == pytest.approx(0.105)
    assert effective_price(2.0, 700, 100.0, 1.5) == pytest.approx(2.105)
    assert effective_price(2.0, 700, -20.0, 1.0) == pytest.approx(2.0 - 0.014)  # negative prices pay


def test_device_power_table():
    assert device_power("nvidia-h100").full_w == 700
    assert device_power("nvidia-v100", full_w=250).full_w == 250
    with pytest.raises(ValueError, match="no power model"):
        device_power("tpu-v9")
