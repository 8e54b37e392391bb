"""sgl_eagle_triton.cycle_timing (SGLANG_EAGLE_TRITON_CYCLE_TIMING): per-rank host and GPU times of decode steps
from host clocks and CUDA events read once complete, on fake clocks and events."""

import gc
from types import SimpleNamespace

import pytest

from sgl_eagle_triton import config, cycle_timing, plugin
from sgl_eagle_triton.cycle_timing import CycleTiming, parse_summaries, timed_forward
from sgl_eagle_triton.glue import hooks
from sgl_eagle_triton.glue.call_sites import EAGLEWorkerV2
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


def _busy_launch_of_the_step():
    return sum(range(20000))


def test_a_profiled_timing_lists_the_launches_functions_after_each_summary():
    """profile_top: the launches run under cProfile and each summary is followed by the listing of those steps (the
    function the launch spent its time in named), then a fresh profile; without it, summaries alone."""
    for top in (0, 5):
        gpu, logged = FakeGpu(), []
        timing = CycleTiming(2, event=gpu.event, log=logged.append, profile_top=top)
        gpu.done = 1e9
        for _ in range(4):
            timing.step(_busy_launch_of_the_step)
        summaries = [line for line in logged if "cycle timing" in line]
        profiles = [line for line in logged if "cycle profile" in line]
        assert len(summaries) == 2 and len(profiles) == (2 if top else 0)
        for listing in profiles:
            assert listing.count("_busy_launch_of_the_step") == 2  # own time, then cumulative


def test_two_summaries_closed_at_once_share_one_profile_listing():
    """Every 1 step, two launches pending until both complete (overlap scheduling): two summaries, one listing
    (the second profile would be empty: pstats refuses it, which must not reach the decode step)."""
    gpu, logged = FakeGpu(), []
    timing = CycleTiming(1, event=gpu.event, log=logged.append, profile_top=3)
    gpu.now = 1.0  # the launches' events complete only once the stream gets there
    timing.step(_busy_launch_of_the_step)
    timing.step(_busy_launch_of_the_step)
    assert logged == []
    gpu.done = 1e9
    timing.step(_busy_launch_of_the_step)
    assert [line.split(",")[0] for line in logged] == ["EAGLE_TRITON cycle timing", "EAGLE_TRITON cycle profile",
                                                       "EAGLE_TRITON cycle timing", "EAGLE_TRITON cycle timing"]


def test_a_profiler_that_cannot_start_is_logged_once_and_the_steps_still_run(monkeypatch):
    logged = []
    timing = CycleTiming(100, event=FakeGpu().event, log=logged.append, profile_top=3)

    def refuse():
        raise ValueError("Another profiling tool is already active")

    monkeypatch.setattr(timing.profiler, "enable", refuse)
    assert timing.step(lambda: "out") == "out" and timing.step(lambda: "again") == "again"
    assert logged == ["EAGLE_TRITON cycle profile, rank 0: off (Another profiling tool is already active)"]
    assert timing.profiler is None


def test_the_env_is_a_number_of_steps_and_a_bad_value_refused(monkeypatch):
    monkeypatch.delenv(config.CYCLE_TIMING_ENV, raising=False)
    assert config.cycle_timing_every() == 0
    for value, every in (("40", 40), ("0", None), ("x", None), ("-3", None), ("\u00b2", None)):
        monkeypatch.setenv(config.CYCLE_TIMING_ENV, value)
        assert config.cycle_timing_every() == every


@pytest.mark.parametrize("mode", ["decode", "prefill", "idle"])
def test_the_wrapped_forward_times_decode_steps_and_breaks_the_chain_at_a_prefill(mode):
    """timed_forward (the plugin wraps SGLang's EAGLEWorkerV2.forward_batch_generation with it): one CycleTiming per
    worker, named by its algorithm and ranked by its TP rank; decode steps timed, a prefill breaks the chain, idle
    batches pass untimed."""
    calls, made = [], []

    class Timing:
        def __init__(self, every, rank, name, profile_top):
            made.append((every, rank, name, profile_top))

        def step(self, launch):
            calls.append("timed")
            return launch()

        def break_chain(self):
            calls.append("break")

    forward = timed_forward(lambda self, batch, x=None: calls.append(("forward", x)) or "out", 40, make_timing=Timing,
                            profile_top=12)
    worker = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="EAGLE3"),
                             ps=SimpleNamespace(tp_rank=3))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: mode == "prefill",
                                                         is_idle=lambda: mode == "idle"),
                            is_extend_in_batch=False)
    assert forward(worker, batch, x=1) == "out" and forward(worker, batch) == "out"
    assert made == [(40, 3, "EAGLE3", 12)]  # one per worker, made at its first call
    before = {"decode": ["timed"], "prefill": ["break"], "idle": []}[mode]
    assert calls == [*before, ("forward", 1), *before, ("forward", None)]


def test_our_worker_is_timed_through_the_parent_it_calls(monkeypatch):
    """Stock and ours are timed by the same wrapper over the same span: our forward_batch_generation calls the
    parent's, which the plugin wraps (a second wrapper would time ours twice)."""
    parent = EAGLEWorkerV2  # SGLang's
    calls = []
    monkeypatch.setattr(parent, "forward_batch_generation", lambda self, batch: calls.append("parent") or "out")
    monkeypatch.setattr(cycle_timing, "_cuda_event", FakeGpu().event)
    monkeypatch.setenv(config.CYCLE_TIMING_ENV, "7")
    plugin._time_eagle_workers(7, 0)
    plugin._time_eagle_workers(7, 0)  # idempotent: register() runs more than once per process
    wrapped = parent.forward_batch_generation
    assert wrapped.sgl_eagle_triton_timed and wrapped.__wrapped__.__name__ == "<lambda>"
    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w.cost_policy, w.ps = None, SimpleNamespace(tp_rank=1)
    w.server_args = SimpleNamespace(speculative_algorithm="EAGLE_TRITON")
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                            is_extend_in_batch=False)
    assert w.forward_batch_generation(batch) == "out" and calls == ["parent"]
    assert w._cycle_timing.name == "EAGLE_TRITON" and w._cycle_timing.rank == 1 and w._cycle_timing.every == 7


def test_summaries_parse_back_from_a_log():
    """parse_summaries reads what summary() writes (so benchmarks can fold a server log into rows), n/a as None."""
    gpu, host, logged = FakeGpu(), [0.0], []
    timing = CycleTiming(2, rank=1, event=gpu.event, clock=lambda: host[0] / 1e3, log=logged.append, name="EAGLE3")
    for _ in range(2):
        gpu.now = max(gpu.now, host[0])
        timing.step(lambda: (host.__setitem__(0, host[0] + 1.5), setattr(gpu, "now", gpu.now + 4.0)))
        host[0] += 3.5
    gpu.done = 1e9
    timing.break_chain()
    timing.step(lambda: None)
    log = "[2026-11-27 17:53:43 TP1] " + logged[0] + "\n[x] Decode batch, #running-req: 1\n"
    log += "[y] EAGLE_TRITON cycle timing, rank 0, 3 decode steps (0 after another): host period n/a (2.00 ms in "
    log += "forward_batch_generation), gpu step 6.00 ms + idle n/a\n"
    assert parse_summaries(log) == [
        dict(name="EAGLE3", rank=1, steps=2, paired=1, host_period=5.0, host_in_forward=1.5, gpu_step=4.0,
             gpu_idle=1.0),
        dict(name="EAGLE_TRITON", rank=0, steps=3, paired=0, host_period=None, host_in_forward=2.0, gpu_step=6.0,
             gpu_idle=None)]


class FakeMode:
    def __init__(self, decode: bool):
        self.decode = decode

    def is_decode(self):
        return self.decode


def test_scheduler_stages_split_each_decode_iteration_and_a_prefill_breaks_the_chain():
    """Three decode iterations of a fake scheduler loop, 10 ms apart: run_batch 4 ms, process_batch_result 3 ms,
    get_next_batch_to_run 1 ms, the loop's own 2 ms; a prefill iteration between iterations 2 and 3 is not counted,
    nor is the one after it (its period spans the prefill). A garbage collection of 0.5 ms strikes inside the
    second iteration's process_batch_result (a full one) and another of 0.25 ms inside the prefill iteration."""
    host, logged, callbacks = [0.0], [], []
    stages = cycle_timing.SchedulerStages(2, rank=1, clock=lambda: host[0] / 1e3, log=logged.append,
                                          gc_callbacks=callbacks)

    def collect(ms, generation):
        callbacks[0]("start", {"generation": generation})
        host[0] += ms
        callbacks[0]("stop", {"generation": generation})

    def spend(ms):
        return lambda: host.__setitem__(0, host[0] + ms)

    def launch():  # run_batch: the worker's forward 2.5 ms (a target's forward of 1 ms inside), the copy 0.5 ms
        stages.time_part("forward_batch_generation", lambda: (
            spend(1.5)(), stages.time_part("forward_batch_generation", spend(1.0))))
        stages.time_part("copy_to_cpu", spend(0.5))
        spend(1.0)()

    def iteration(decode, gc_ms=0.0, generation=0):
        stages.iteration(decode)
        stages.time("run_batch", launch)
        stages.time("_apply_war_barrier", spend(0.0))
        stages.time("process_batch_result", lambda: (spend(3.0 - gc_ms)(), gc_ms and collect(gc_ms, generation)))
        stages.time("process_input_requests", spend(0.0))
        host[0] += 2.0  # the loop's own work (receiving requests, copying the batch)
        stages.time("get_next_batch_to_run", spend(1.0))

    iteration(True)
    iteration(True, gc_ms=0.5, generation=2)
    iteration(True)
    assert logged == ["no-spec scheduler stages, rank 1, 2 decode iterations: period 10.000 ms = "
                      "process_input_requests 0.000 + get_next_batch_to_run 1.000 + run_batch 4.000 + "
                      "_apply_war_barrier 0.000 + process_batch_result 3.000 + rest 2.000 (ms); garbage collection "
                      "0.250 ms, full 0.250 ms",
                      "no-spec run_batch parts, rank 1, 2 decode iterations: resolve_seq_lens_cpu 0.000 + "
                      "resolve_forward_inputs 0.000 + forward_batch_generation 2.500 + record_batch_in_overlap 0.000 + "
                      "_relay_forward_payload 0.000 + copy_to_cpu 0.500 + other 1.000 (ms)",
                      "no-spec sglang parts, rank 1, 2 decode iterations: new_tokens_required_next_decode 0.000 + "
                      "prepare_for_decode 0.000 + init_new 0.000 + model_forward 0.000 + sample 0.000 + "
                      "process_batch_result_decode 0.000 + stream_output 0.000 (ms)"]
    host[0] += 100.0  # a long pause in the open iteration: counted as that iteration's rest
    iteration(False, gc_ms=0.25, generation=1)
    iteration(True)
    iteration(True)
    assert stages.count == 1 and stages.sums["period"] * 1e3 == pytest.approx(10.0)  # only the last pair
    assert stages.sums["gc"] == 0.0  # the prefill iteration's collection is not counted
    assert cycle_timing.parse_stage_summaries("[TP1] " + logged[0] + "\n") == [dict(
        name="no-spec", rank=1, count=2, period=10.0, process_input_requests=0.0, get_next_batch_to_run=1.0,
        run_batch=4.0, _apply_war_barrier=0.0, process_batch_result=3.0, rest=2.0, gc=0.25, gc_full=0.25)]
    assert cycle_timing.parse_parts_summaries(logged[1]) == [dict(
        name="no-spec", rank=1, count=2, resolve_seq_lens_cpu=0.0, resolve_forward_inputs=0.0,
        forward_batch_generation=2.5, record_batch_in_overlap=0.0, _relay_forward_payload=0.0, copy_to_cpu=0.5,
        other=1.0)]


def test_a_profiled_scheduler_lists_every_stages_functions_run_batch_included():
    host, logged = [0.0], []
    stages = cycle_timing.SchedulerStages(1, clock=lambda: host[0], log=logged.append, name="EAGLE3", profile_top=5,
                                          gc_callbacks=[])
    for _ in range(2):
        stages.iteration(True)
        stages.time("run_batch", _busy_launch_of_the_step)
        stages.time("process_batch_result", lambda: sorted(range(5000), key=lambda i: -i))
    assert logged[0].startswith("EAGLE3 scheduler stages, rank 0, 1 decode iterations")
    assert logged[3].startswith("EAGLE3 scheduler profile, rank 0, by own then cumulative time")
    assert "<lambda>" in logged[3] and "_busy_launch_of_the_step" in logged[3]


def test_every_scheduler_is_timed_through_its_wrapped_stages(monkeypatch):
    """The plugin wraps SGLang's Scheduler stages once per process (register() runs more than once); one
    SchedulerStages per scheduler, named after its speculative algorithm; run_batch's batch decides the chain."""
    from sglang.srt.managers.scheduler import Scheduler

    calls = []
    for stage in cycle_timing.SCHEDULER_STAGES:
        monkeypatch.setattr(Scheduler, stage, lambda self, *a, _s=stage, **k: calls.append((_s, a)) or _s)
    monkeypatch.setattr(hooks, "wrap_parts", lambda parts, wrap, marker, *targets: [])  # tested below
    assert plugin._time_scheduler_stages(9, 0) and plugin._time_scheduler_stages(9, 0)  # run_batch timed (once)
    assert Scheduler.run_batch.sgl_eagle_triton_timed and Scheduler.run_batch.__wrapped__.__name__ == "<lambda>"
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.ps, scheduler.server_args = SimpleNamespace(tp_rank=3), SimpleNamespace(speculative_algorithm=None)
    callbacks = list(gc.callbacks)
    batch = SimpleNamespace(forward_mode=FakeMode(True), is_extend_in_batch=False)
    try:
        assert scheduler.run_batch(batch) == "run_batch" and scheduler.process_batch_result(batch, "r") == \
            "process_batch_result"
        assert calls == [("run_batch", (batch,)), ("process_batch_result", (batch, "r"))]
        timing = scheduler._stage_timing
        assert (timing.every, timing.rank, timing.name, timing.profile_top) == (9, 3, "no-spec", 0)
        assert scheduler._stage_timing._entry is not None  # a decode run_batch opened an iteration
        scheduler.run_batch(SimpleNamespace(forward_mode=FakeMode(False)))
        assert scheduler._stage_timing._entry is None and scheduler._stage_timing.count == 0
        assert gc.callbacks[len(callbacks):] == [timing._on_gc]  # the scheduler's collections are timed
    finally:
        gc.callbacks[:] = callbacks


def test_run_batch_parts_are_timed_inside_a_timed_run_batch_only(monkeypatch):
    """A part (timed_part: an SGLang function run_batch calls) counts in the scheduler whose run_batch is under way
    (timed_stage); called elsewhere (e.g. a worker's forward outside the scheduler loop) it runs untimed."""
    host, logged = [0.0], []

    def copy_to_cpu(result):
        host[0] += 0.25
        return result

    part = cycle_timing.timed_part("copy_to_cpu", copy_to_cpu)
    assert part.sgl_eagle_triton_part and part("r") == "r"  # outside run_batch: untimed
    stages = cycle_timing.SchedulerStages(2, clock=lambda: host[0] / 1e3, log=logged.append, gc_callbacks=[])
    run_batch = cycle_timing.timed_stage("run_batch", lambda self, batch: part(batch), 2,
                                         make_stages=lambda *a, **k: stages)
    scheduler, batch = SimpleNamespace(), SimpleNamespace(forward_mode=FakeMode(True), is_extend_in_batch=False)
    for _ in range(3):
        assert run_batch(scheduler, batch) is batch
    assert cycle_timing.parse_parts_summaries(logged[1])[0]["copy_to_cpu"] == pytest.approx(0.25)
    assert cycle_timing.parse_parts_summaries(logged[1])[0]["other"] == pytest.approx(0.0)
    assert not cycle_timing._RUNNING  # run_batch left


def test_sglang_parts_are_timed_inside_any_timed_stage_and_logged_apart():
    """An SGLang part (timed_part of one of SGLANG_PARTS: SGLang's own function inside a stage) counts wherever a
    timed stage is under way, here the result processing, and is logged on its own line (not in run_batch's other);
    outside a stage it runs untimed."""
    host, logged = [0.0], []

    def busy(ms):
        host[0] += ms

    stream = cycle_timing.timed_part("stream_output", lambda: busy(0.3))
    stream()  # outside a stage: untimed
    stages = cycle_timing.SchedulerStages(2, clock=lambda: host[0] / 1e3, log=logged.append, gc_callbacks=[])
    make = lambda *a, **k: stages  # noqa: E731
    run_batch = cycle_timing.timed_stage("run_batch", lambda self, batch: busy(1.0), 2, make_stages=make)
    process = cycle_timing.timed_stage("process_batch_result", lambda self, batch: stream() or busy(0.2), 2,
                                       make_stages=make)
    scheduler, batch = SimpleNamespace(), SimpleNamespace(forward_mode=FakeMode(True), is_extend_in_batch=False)
    for _ in range(3):
        run_batch(scheduler, batch)
        process(scheduler, batch)
    line = cycle_timing.parse_sglang_parts_summaries(logged[2])[0]
    assert line["stream_output"] == pytest.approx(0.3) and line["prepare_for_decode"] == 0.0
    assert cycle_timing.parse_parts_summaries(logged[1])[0]["other"] == pytest.approx(1.0)
    assert cycle_timing.parse_stage_summaries(logged[0])[0]["process_batch_result"] == pytest.approx(0.5)
    assert not cycle_timing._IN_STAGE


@pytest.mark.parametrize("scheduler_timed", [True, False])
def test_the_profile_runs_in_the_scheduler_where_its_run_batch_is_timed(monkeypatch, scheduler_timed):
    """One profiler at a time: with the scheduler's run_batch profiled (it holds the worker's launch), the workers
    are timed unprofiled; a scheduler without run_batch leaves the profile to the workers."""
    made = []
    monkeypatch.setenv(config.CYCLE_TIMING_ENV, "5")
    monkeypatch.setenv(config.CYCLE_PROFILE_ENV, "12")
    monkeypatch.setattr(plugin, "_time_scheduler_stages", lambda every, top: made.append(("stages", every, top))
                        or scheduler_timed)
    monkeypatch.setattr(plugin, "_time_eagle_workers", lambda every, top: made.append(("workers", every, top)))
    monkeypatch.setattr(plugin, "get_spec", lambda name: "registered")  # stop after the diagnostics
    plugin.register()
    assert made == [("stages", 5, 12), ("workers", 5, 0 if scheduler_timed else 12)]


@pytest.mark.parametrize("scope, workers_timed", [(None, True), ("all", True), ("scheduler", False), ("x", True)])
def test_the_scope_scheduler_leaves_the_workers_untimed(monkeypatch, scope, workers_timed):
    """SGLANG_EAGLE_TRITON_CYCLE_TIMING_SCOPE=scheduler: the schedulers' stages only, so that every server carries the
    same instrument; unset or all: the EAGLE workers' decode steps too (a bad value: EAGLE_TRITON refuses it at start,
    other servers time as under all)."""
    made = []
    monkeypatch.setenv(config.CYCLE_TIMING_ENV, "5")
    monkeypatch.delenv(config.CYCLE_PROFILE_ENV, raising=False)
    if scope is None:
        monkeypatch.delenv(config.CYCLE_TIMING_SCOPE_ENV, raising=False)
    else:
        monkeypatch.setenv(config.CYCLE_TIMING_SCOPE_ENV, scope)
    assert config.cycle_timing_scope() == {None: "all", "x": None}.get(scope, scope)
    monkeypatch.setattr(plugin, "_time_scheduler_stages", lambda every, top: made.append("stages") or True)
    monkeypatch.setattr(plugin, "_time_eagle_workers", lambda every, top: made.append("workers"))
    monkeypatch.setattr(plugin, "get_spec", lambda name: "registered")  # stop after the diagnostics
    plugin.register()
    assert made == (["stages", "workers"] if workers_timed else ["stages"])


def test_a_step_our_worker_launches_under_an_untimed_parent_is_only_its_run_batch_part():
    """With the workers untimed (scope scheduler) SGLang's method carries no timer: worker_step runs the step once,
    inside the running run_batch's forward part, with no CUDA event."""
    host = [0.0]
    stages = cycle_timing.SchedulerStages(100, clock=lambda: host[0] / 1e3, log=lambda line: None, gc_callbacks=[])

    def step():
        host[0] += 0.4
        return "result"

    cycle_timing._RUNNING.append(stages)
    try:
        assert cycle_timing.worker_step(SimpleNamespace(), lambda self, batch: None, step) == "result"
    finally:
        cycle_timing._RUNNING.pop()
    assert stages.parts_open["forward_batch_generation"] == pytest.approx(0.4e-3)
    assert cycle_timing.worker_step(SimpleNamespace(), lambda self, batch: None, step) == "result"  # no scheduler


def test_a_nested_stage_counts_in_the_outer_one_and_a_refused_profiler_never_fails_a_stage():
    """process_batch_result inside process_input_requests (SGLang pauses generation from a request) counts once, in
    the outer stage; a profiler another one holds is logged once and the stages run on unprofiled."""
    host, logged = [0.0], []
    stages = cycle_timing.SchedulerStages(1, clock=lambda: host[0] / 1e3, log=logged.append, profile_top=3,
                                          gc_callbacks=[])

    class Refusing:
        def enable(self):
            raise ValueError("Another profiling tool is already active")

    stages.profiler = Refusing()
    stages.iteration(True)

    def inner():
        host[0] += 2.0

    def outer():
        host[0] += 1.0
        stages.time("process_batch_result", inner)

    stages.time("process_input_requests", outer)
    assert stages.open["process_input_requests"] * 1e3 == pytest.approx(3.0)
    assert stages.open["process_batch_result"] == 0.0
    assert stages.profiler is None and logged == ["no-spec scheduler profile, rank 0: off (Another profiling tool "
                                                  "is already active)"]


def test_an_ab_inside_one_server_times_each_arm_apart():
    """Arms alternating every two steps (config.AB_STEPS_ENV): arm "a" launches in 1 ms, "b" in 3 ms, each step's
    period (to the next step's call) belongs to the arm of the step that began it; one arms line after each summary,
    read back by parse_arm_summaries and paired line by line by bench.stage_split --arms."""
    from bench import stage_split
    from sgl_eagle_triton.cycle_timing import parse_arm_summaries

    gpu, host, logged = FakeGpu(), [0.0], []
    timing = CycleTiming(8, event=gpu.event, clock=lambda: host[0] / 1e3, log=logged.append)
    gpu.done = 1e9
    for i in range(17):
        timing.arm = "a" if (i // 2) % 2 == 0 else "b"
        launch_ms = 1.0 if timing.arm == "a" else 3.0

        def launch(ms=launch_ms):
            host[0] += ms

        timing.step(launch)
        host[0] += 5.0
    arms_lines = [line for line in logged if "cycle timing arms" in line]
    assert len(arms_lines) == 2
    assert arms_lines[0] == ("EAGLE_TRITON cycle timing arms, rank 0: a: host period 6.000 ms, in forward 1.000 ms, "
                             "gpu step 0.000 ms, 4 steps ; b: host period 8.000 ms, in forward 3.000 ms, gpu step "
                             "0.000 ms, 4 steps")
    parsed = parse_arm_summaries("\n".join(logged))
    assert parsed[0]["arms"]["b"] == {"steps": 4, "host_in_forward": 3.0, "gpu_step": 0.0, "host_period": 8.0}
    row = stage_split.arms("\n".join(logged), skip=0, first="a", second="b")
    assert row["lines"] == 2 and row["a", "host_in_forward"] == 1.0
    assert row["ratio", "host_in_forward"]["geomean"] == pytest.approx(1 / 3)
    assert "| log | 2 | a / b |" in stage_split.arms_table({"log": row})
    named = "\n".join(logged).replace(" a: ", " lean: ").replace(" b: ", " sglang-draft: ")
    assert stage_split.arm_names(named) == ("lean", "sglang-draft") and stage_split.arms(named, 0)["lines"] == 2
    plain = CycleTiming(2, event=gpu.event, log=logged.append)
    logged.clear()
    for _ in range(2):
        plain.step(lambda: None)
    assert len(logged) == 1  # no arms: no arms line


def test_an_adaptive_servers_steps_are_timed_by_state_beside_its_ab_arms():
    """The worker's state labels (``state``: "steps0-held", "steps5"): each state's own line after each summary, its
    period the one its step began (as an arm's), with its median period and the share of its time in pauses (periods
    over the cost policy's pause rule, 2x the median + 1 ms), read back by parse_arm_summaries(states=True) and not
    taken for an A/B's arms; an A/B's arms line keeps its own labels (and no spread) when both run."""
    from sgl_eagle_triton.cycle_timing import parse_arm_summaries

    gpu, host, logged = FakeGpu(), [0.0], []
    timing = CycleTiming(6, event=gpu.event, clock=lambda: host[0] / 1e3, log=logged.append)
    gpu.done = 1e9
    for i in range(7):  # three held steps (1 ms to launch, 2 ms after), then three at steps 5 (4 ms, 2 ms after)
        timing.state = "steps0-held" if i < 3 else "steps5"
        timing.arm = "on" if i % 2 == 0 else "off"
        launch_ms = 1.0 if i < 3 else 4.0

        def launch(ms=launch_ms):
            host[0] += ms

        timing.step(launch)
        host[0] += 2.0 + (10.0 if i == 1 else 0.0)  # the second held step's period a 13 ms pause
    states = [line for line in logged if "cycle timing states" in line]
    assert states == ["EAGLE_TRITON cycle timing states, rank 0: steps0-held: host period 6.333 ms (median 3.000 ms, "
                      "0.684 in pauses), in forward 1.000 ms, gpu step 0.000 ms, 3 steps ; steps5: host period 6.000 "
                      "ms (median 6.000 ms, 0.000 in pauses), in forward 4.000 ms, gpu step 0.000 ms, 3 steps"]
    # (the third held step's period ends at the first steps-5 call; 13 of the held periods' 19 ms in the pause)
    parsed = parse_arm_summaries("\n".join(logged), states=True)
    assert parsed[0]["arms"]["steps5"] == {"steps": 3, "host_in_forward": 4.0, "gpu_step": 0.0, "host_period": 6.0,
                                           "median_period": 6.0, "paused": 0.0}
    assert parsed[0]["arms"]["steps0-held"]["median_period"] == 3.0
    assert parsed[0]["arms"]["steps0-held"]["paused"] == 0.684
    assert "median" not in next(line for line in logged if "cycle timing arms" in line)
    assert set(parse_arm_summaries("\n".join(logged))[0]["arms"]) == {"on", "off"}  # the A/B's line, its own arms

_FAKE_SCHEDULER = '''
def leaf():
    return 1


def helper(n):
    total = 0
    for _ in range(n):
        total += leaf()
    return total


def run_batch(n):
    return helper(n) + leaf()
'''


def _fake_scheduler(folder):
    import importlib.util

    path = folder / "fake_scheduler.py"  # bench.profile_diff counts the calls of a scheduler.py's run_batch as steps
    path.write_text(_FAKE_SCHEDULER)
    spec = importlib.util.spec_from_file_location("fake_scheduler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kept_profiles_are_tallied_per_decode_step(monkeypatch, tmp_path):
    """SGLANG_EAGLE_TRITON_CYCLE_PROFILE_DIR: every listed scheduler profile is also written whole; bench.profile_diff
    sums a server's files and reads calls per decode iteration (run_batch's calls) exactly, callees by call edge."""
    from bench import profile_diff

    scheduler = _fake_scheduler(tmp_path)
    folders = {}
    for name, n in (("a", 2), ("b", 5)):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        monkeypatch.setenv(config.CYCLE_PROFILE_DIR_ENV, str(folders[name]))
        logged = []
        stages = cycle_timing.SchedulerStages(3, log=logged.append, profile_top=2, gc_callbacks=[])
        for _ in range(7):  # the first opens the chain: six iterations counted, two listings
            stages.iteration(True)
            stages.time("run_batch", lambda n=n: scheduler.run_batch(n))
        assert sum("scheduler profile" in line for line in logged) == 2
        assert len(list(folders[name].glob("no-spec-scheduler-profile-rank-0-pid*.prof"))) == 2
    a, b = (profile_diff.load(str(folders[name])) for name in "ab")
    assert profile_diff.steps_of(a) == profile_diff.steps_of(b) == 6
    per_step_a, per_step_b = profile_diff.per_step(a), profile_diff.per_step(b)
    leaf = next(key for key in per_step_a if key.endswith("(leaf)"))
    assert per_step_a[leaf][0] == pytest.approx(3.0) and per_step_b[leaf][0] == pytest.approx(6.0)
    from_helper = profile_diff.callees(b, "(helper)")
    assert from_helper[leaf][0] == pytest.approx(5.0)  # run_batch's own call of leaf is not helper's
    # every row (the order by time difference moves with the host's timing: run_batch is not always in a top 5)
    table = profile_diff.diff_table(per_step_a, per_step_b, ("a", "b"), top=len(per_step_a) + len(per_step_b))
    assert "(run_batch)` | 1.00 | 1.00 |" in table


def test_a_profile_folder_that_cannot_be_written_never_fails_a_step(monkeypatch, tmp_path):
    """An unwritable profile folder is logged once, then no more profiles are kept; the listing goes on."""
    import cProfile
    import pstats

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(config.CYCLE_PROFILE_DIR_ENV, str(blocker))
    profiler = cProfile.Profile()
    profiler.enable()
    sum(range(3))
    profiler.disable()
    assert cycle_timing.dump_profile(pstats.Stats(profiler), str(blocker), "x") is None
    assert config.CYCLE_PROFILE_DIR_ENV not in __import__("os").environ
    assert "x, by own then cumulative time" in cycle_timing._profile_report(profiler, 2, "x")


def test_profile_diff_counts_iterations_by_the_larger_marker():
    """A drafting server's profile can miss run_batch's returns (2 calls counted in 200 iterations):
    process_batch_result's calls count the iterations there."""
    from bench import profile_diff

    stats = SimpleNamespace(stats={("/s/managers/scheduler.py", 1, "run_batch"): (0, 2, 0.0, 0.0, {}),
                                   ("/s/managers/scheduler.py", 9, "process_batch_result"): (200, 200, 0.0, 0.0, {}),
                                   ("/s/other.py", 1, "run_batch"): (500, 500, 0.0, 0.0, {})})
    assert profile_diff.steps_of(stats) == 200


def test_a_decode_step_our_worker_launches_itself_is_timed_once_over_the_same_span(monkeypatch):
    """Where the plain steps 0 runs, our forward_batch_generation launches decode steps itself (cycle_timing.
    worker_step): each is one step of the worker's timer (made here if SGLang's timed method never ran) and one
    forward part of the running run_batch, the parent's timed method inside it passing through; a step that never
    reaches the parent (a direct plain step) is timed too."""
    gpu, host = FakeGpu(), [0.0]
    made = []

    def make(every, rank, name, profile_top):
        made.append(every)
        return CycleTiming(every, rank=rank, event=gpu.event, clock=lambda: host[0] / 1e3, log=lambda line: None,
                           name=name)

    parent = timed_forward(lambda self, batch: host.__setitem__(0, host[0] + 2.0) or "parent", 5, make_timing=make)
    worker = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="EAGLE_TRITON"),
                             ps=SimpleNamespace(tp_rank=0))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                            is_extend_in_batch=False)
    stages = cycle_timing.SchedulerStages(5, clock=lambda: host[0] / 1e3, log=lambda line: None, gc_callbacks=[])
    cycle_timing._RUNNING.append(stages)
    try:
        direct = cycle_timing.worker_step(worker, parent, lambda: host.__setitem__(0, host[0] + 1.0) or "direct")
        through = cycle_timing.worker_step(worker, parent, lambda: parent(worker, batch))
    finally:
        cycle_timing._RUNNING.pop()
    assert (direct, through) == ("direct", "parent") and made == [5]  # one timer, made by the first step
    gpu.done = 1e9
    worker._cycle_timing._collect()
    assert worker._cycle_timing.counts["steps"] == 2  # the parent's own timing inside passed through
    assert worker._cycle_timing.sums["host_in_forward"] == pytest.approx(3.0)
    assert stages.parts_open["forward_batch_generation"] * 1e3 == pytest.approx(3.0)
    assert cycle_timing.worker_step(worker, lambda self, batch: None, lambda: "untimed") == "untimed"


def test_profile_diff_leaves_out_the_profiles_that_hold_a_triton_build(tmp_path):
    """A profile window in which a Triton kernel was compiled or its launcher built (one-off work at a kernel's first
    launch) is left out and named; a folder of nothing else is refused; --keep-builds reads them all."""
    import cProfile
    import importlib.util

    from bench import profile_diff

    scheduler = _fake_scheduler(tmp_path)
    build_path = tmp_path / "triton" / "runtime" / "build.py"
    build_path.parent.mkdir(parents=True)
    build_path.write_text("def compile_module_from_src():\n    return 0\n")
    spec = importlib.util.spec_from_file_location("fake_triton_build", build_path)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    folder = tmp_path / "server"
    folder.mkdir()
    for i, builds in enumerate((1, 0, 0)):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(builds):
            build.compile_module_from_src()
        for _ in range(2):
            scheduler.run_batch(3)
        profiler.disable()
        profiler.dump_stats(str(folder / f"p-{i}.prof"))
    steady = profile_diff.load(str(folder), leave_out_builds=True)
    assert steady.left_out == ["p-0.prof"] and profile_diff.steps_of(steady) == 4
    assert profile_diff.builds_in(steady) == 0
    everything = profile_diff.load(str(folder))
    assert everything.left_out == [] and profile_diff.steps_of(everything) == 6
    assert profile_diff.builds_in(everything) == 1
    (folder / "p-1.prof").unlink()
    (folder / "p-2.prof").unlink()
    with pytest.raises(SystemExit, match="Triton build"):
        profile_diff.load(str(folder), leave_out_builds=True)
