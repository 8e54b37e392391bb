"""bench/trace_breakdown.py on a synthetic Chrome trace shaped like torch profiler's."""

import gzip
import json

import pytest

from bench import trace_breakdown as breakdown


def event(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def cycle(t0, corr):
    """One decode cycle: draft (a graph launch of two kernels), verify (one kernel), draft_extend (none)."""
    return [
        event("user_annotation", "draft", t0, 100),
        event("cuda_runtime", "cudaGraphLaunch", t0 + 10, 5, correlation=corr),
        event("kernel", "draft_kernel_a", t0 + 20, 30, correlation=corr),
        event("kernel", "draft_kernel_b", t0 + 60, 20, correlation=corr),
        event("gpu_user_annotation", "draft", t0 + 20, 60),
        event("user_annotation", "step[TARGET_VERIFY bs=2]", t0 + 120, 50),
        event("cuda_driver", "cuLaunchKernelEx", t0 + 130, 5, correlation=corr + 1),  # a Triton launch
        event("kernel", "verify_kernel", t0 + 180, 40, correlation=corr + 1),  # runs after its CPU range
        event("user_annotation", "draft_extend", t0 + 200, 10),
    ]


def test_stage_times_per_cycle(tmp_path):
    trace = {"traceEvents": cycle(0, 1) + cycle(1000, 3) + [event("kernel", "stray", 500, 99, correlation=99)]}
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    stages = breakdown.stage_times(breakdown.load_trace(path))
    assert stages["draft"] == {"count": 2, "cpu_ms": 0.1, "gpu_busy_ms": 0.05, "compute_busy_ms": 0.05,
                               "gpu_span_ms": 0.06}
    verify = stages["verify_forward"]
    assert verify["gpu_busy_ms"] == pytest.approx(0.04) and verify["gpu_span_ms"] is None and "decode" not in stages
    assert stages["draft_extend"]["gpu_busy_ms"] == 0
    # One cycle (draft start 0 -> 1000): the kernels launched in it (the stray one has no launch record).
    assert stages["cycle"] == {"count": 1, "cpu_ms": 1.0, "gpu_busy_ms": pytest.approx(0.09),
                               "compute_busy_ms": pytest.approx(0.09), "gpu_span_ms": None}


def test_overlapping_kernels_count_once():
    """Programmatic dependent launch starts a kernel while its predecessor drains: busy time is the union."""
    assert breakdown.busy_us([(0, 30), (20, 50), (60, 70), (65, 68)]) == 60
    assert breakdown.busy_us([]) == 0
    events = [event("user_annotation", "draft", 0, 100), event("cuda_runtime", "cudaGraphLaunch", 1, 1, correlation=7),
              event("kernel", "a", 10, 30, correlation=7), event("kernel", "b", 30, 30, correlation=7)]
    assert breakdown.stage_times({"traceEvents": events})["draft"]["gpu_busy_ms"] == pytest.approx(0.05)


def test_kernel_table_lists_a_stages_kernels_by_gpu_time():
    """What a stage's busy time is made of, per occurrence: the graph replay's two draft kernels, the verify's
    kernel (launched in its range, run after it); none for a stage without ranges."""
    trace = {"traceEvents": cycle(0, 1) + cycle(1000, 3)}
    assert breakdown.kernel_table(trace, "draft") == [("draft_kernel_a", 1.0, 30.0), ("draft_kernel_b", 1.0, 20.0)]
    assert breakdown.kernel_table(trace, "verify_forward") == [("verify_kernel", 1.0, 40.0)]
    assert breakdown.kernel_table(trace, "decode") == [] and breakdown.kernel_table(trace, "draft", top=1) == [
        ("draft_kernel_a", 1.0, 30.0)]


def test_compute_busy_time_leaves_collectives_out():
    """Under tensor parallelism a rank's all-reduce spins until the other ranks arrive: ``compute_busy_ms`` is the
    stage's busy time without SGLang's custom all-reduce and NCCL kernels."""
    events = [event("user_annotation", "draft", 0, 500), event("cuda_runtime", "cudaGraphLaunch", 1, 1, correlation=7),
              event("kernel", "_linear_kernel", 10, 30, correlation=7),
              event("kernel", "void (anonymous namespace)::all_reduce_kernel<float>", 40, 300, correlation=7),
              event("kernel", "ncclDevKernel_AllGather_RING_LL(x)", 340, 50, correlation=7),
              event("kernel", "_merge_kernel", 390, 10, correlation=7),
              event("kernel", "_draft_input_kernel", 395, 10, correlation=7),  # launched early under PDL: overlaps
              event("kernel", "cross_device_reduce_1stage<half, 4>", 405, 20, correlation=7)]  # SGLang's older AR
    draft = breakdown.stage_times({"traceEvents": events})["draft"]
    assert draft["gpu_busy_ms"] == pytest.approx(0.415) and draft["compute_busy_ms"] == pytest.approx(0.045)
