"""Reading Gavel-format traces and throughputs: run times, derived GPU counts, clear errors."""

from __future__ import annotations

import json

import pytest

from job_traces import TraceError, read_throughputs, read_trace


def _line(job_type="ResNet-18 (batch size 32)", steps="1000", arrival="5.0", gpus="1"):
    return "\t".join([job_type, "cd %s && python3 main.py", "--num_steps", "1", steps, arrival, gpus])


def _throughputs(tmp_path, table=None):
    table = table or {
        "v100": {"('ResNet-18 (batch size 32)', 1)": {"null": 10.0, "('A3C', 1)": [1.0, 2.0]},
                 "('ResNet-18 (batch size 32)', 2)": {"null": 16.0},
                 "('ResNet-18 (batch size 32)', 8)": {"null": 40.0}},
        "k80": {"('ResNet-18 (batch size 32)', 1)": {"null": 2.0},
                "('ResNet-18 (batch size 32)', 2)": {"null": 0.0}},
        "v100_unconsolidated": {"('ResNet-18 (batch size 32)', 1)": {"null": 99.0}},
    }
    path = tmp_path / "thr.json"
    path.write_text(json.dumps(table))
    return read_throughputs(path)


def test_trace_fields_and_run_time(tmp_path):
    path = tmp_path / "vc.trace"
    path.write_text(_line(steps="1000", arrival="5.5", gpus="1") + "\n" + _line(steps="3200", arrival="7", gpus="2") + "\n")
    jobs = read_trace(path)
    assert [(j.job_type, j.num_gpus, j.total_steps, j.arrival_s) for j in jobs] == [
        ("ResNet-18 (batch size 32)", 1, 1000, 5.5), ("ResNet-18 (batch size 32)", 2, 3200, 7.0)]
    thr = _throughputs(tmp_path)
    assert thr.worker_types == ("k80", "v100")  # plain worker types only
    assert jobs[0].runtime_s(thr, "v100") == pytest.approx(100.0)  # 1000 steps / 10 steps/s
    assert jobs[1].runtime_s(thr, "v100") == pytest.approx(200.0)  # 3200 / 16
    assert jobs[0].runtime_s(thr, "k80") == pytest.approx(500.0)


def test_missing_gpu_count_scales_the_nearest_measured_one(tmp_path):
    thr = _throughputs(tmp_path)
    # 7 GPUs: nearest measured is 8 -> 40 * 7/8; 64 GPUs: 8 -> 40 * 8; 3 GPUs: tie 2/4 -> 2 measured only -> 16 * 3/2
    assert thr.steps_per_s("v100", "ResNet-18 (batch size 32)", 7) == pytest.approx(35.0)
    assert thr.steps_per_s("v100", "ResNet-18 (batch size 32)", 64) == pytest.approx(320.0)
    assert thr.steps_per_s("v100", "ResNet-18 (batch size 32)", 3) == pytest.approx(24.0)
    # a measured 0 (did not run) is derived from the nearest non-zero count
    assert thr.steps_per_s("k80", "ResNet-18 (batch size 32)", 2) == pytest.approx(4.0)
    with pytest.raises(TraceError, match="no measured throughput for job type 'CycleGAN' on v100"):
        thr.steps_per_s("v100", "CycleGAN", 1)


@pytest.mark.parametrize("line, message", [
    ("a\tb\tc", r"vc\.trace:2: expected 7 tab-separated fields .* found 3"),
    (_line(steps="many"), r"vc\.trace:2: total_steps 'many' is not an integer"),
    (_line(arrival="soon"), r"vc\.trace:2: arrival_time_s 'soon' is not a number"),
    (_line(gpus="1.5"), r"vc\.trace:2: num_gpus '1.5' is not an integer"),
    (_line(gpus="0"), r"vc\.trace:2: num_gpus must be positive"),
    (_line(arrival="-3"), r"vc\.trace:2: arrival_time_s must be a finite number >= 0"),
])
def test_malformed_trace_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "vc.trace"
    path.write_text(_line() + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_malformed_throughputs_name_the_file(tmp_path):
    path = tmp_path / "thr.json"
    path.write_text("{\n  \"v100\": {\n")
    with pytest.raises(TraceError, match=r"thr\.json:\d+: not valid JSON"):
        read_throughputs(path)
    path.write_text(json.dumps({"v100": {"ResNet": {"null": 1.0}}}))
    with pytest.raises(TraceError, match=r"thr\.json: worker type 'v100': key 'ResNet'"):
        read_throughputs(path)
    path.write_text(json.dumps({"v100": {"('A3C', 1)": {"other": 1.0}}}))
    with pytest.raises(TraceError, match=r"no \"null\""):
        read_throughputs(path)
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.trace")
