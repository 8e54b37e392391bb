"""sgl_eagle_triton.cycle_timing (SGLANG_EAGLE_TRITON_CYCLE_TIMING): per-rank host and GPU times of decode steps
from host clocks and CUDA events read once complete, on fake clocks and events."""

from types import SimpleNamespace

import pytest

from sgl_eagle_triton import config
from sgl_eagle_triton.cycle_timing import CycleTiming
from sgl_eagle_triton.worker import EagleTritonWorkerV2


class FakeGpu:
    """Events stamped with a fake stream clock; ``done`` is how far the stream has run."""

    def __init__(self):
        self.now, self.done = 0.0, 0.0

    def event(self):
        gpu = self

        class Event:
            t = gpu.now

            def query(self):
                return self.t <= gpu.done

            def elapsed_time(self, other):
                return other.t - self.t

        return Event()


def test_host_period_launch_time_gpu_step_and_idle_per_decode_step():
    """Three decode steps: host calls every 10 ms, 2 ms inside the launch; the stream runs each step 6 ms and waits
    4 ms for the next launch. A prefill between steps 3 and 4 breaks the pair; events are read only once complete."""
    gpu, host, logged = FakeGpu(), [0.0], []
    timing = CycleTiming(3, rank=2, event=gpu.event, clock=lambda: host[0] / 1e3, log=logged.append)

    def launch():
        host[0] += 2.0  # the launch's host time
        gpu.now += 6.0  # the stream's work of this step

    for _ in range(3):
        gpu.now = max(gpu.now, host[0])  # the stream idles until the host launches
        timing.step(launch)
        host[0] += 8.0
    assert logged == []  # no event has completed yet
    gpu.done = 1e9
    timing.break_chain()
    gpu.now = max(gpu.now, host[0])
    timing.step(launch)
    assert logged == ["EAGLE_TRITON cycle timing, rank 2, 3 decode steps (2 after another): host period 10.00 ms "
                      "(2.00 ms in forward_batch_generation), gpu step 6.00 ms + idle 4.00 ms"]
    assert timing.counts == {"paired": 0, "steps": 1}  # the step after the prefill starts a new chain
    assert timing.summary().endswith("host period n/a (2.00 ms in forward_batch_generation), gpu step 6.00 ms + "
                                     "idle n/a")


def test_the_env_is_a_number_of_steps_and_a_bad_value_refused(monkeypatch):
    monkeypatch.delenv(config.CYCLE_TIMING_ENV, raising=False)
    assert config.cycle_timing_every() == 0
    for value, every in (("40", 40), ("0", None), ("x", None), ("-3", None), ("\u00b2", None)):
        monkeypatch.setenv(config.CYCLE_TIMING_ENV, value)
        assert config.cycle_timing_every() == every


@pytest.mark.parametrize("mode", ["decode", "prefill", "idle"])
def test_the_worker_times_decode_steps_and_breaks_the_chain_at_a_prefill(monkeypatch, mode):
    calls = []
    monkeypatch.setattr(EagleTritonWorkerV2.__mro__[1], "forward_batch_generation",
                        lambda self, batch: calls.append("forward") or "out")
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.cost_policy = None
    w._cycle_timing = SimpleNamespace(step=lambda launch: calls.append("timed") or launch(),
                                      break_chain=lambda: calls.append("break"))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: mode == "prefill",
                                                         is_idle=lambda: mode == "idle"),
                            is_extend_in_batch=False)
    assert w.forward_batch_generation(batch) == "out"
    assert calls == {"decode": ["timed", "forward"], "prefill": ["break", "forward"], "idle": ["forward"]}[mode]
