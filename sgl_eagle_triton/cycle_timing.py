"""Per-rank decode-cycle timing without a profiler (``SGLANG_EAGLE_TRITON_CYCLE_TIMING=N``: a log line every N
decode steps on every rank of every EAGLE V2 server of the process, stock EAGLE / EAGLE3 and EAGLE_TRITON alike:
the plugin wraps SGLang's ``EAGLEWorkerV2.forward_batch_generation`` with :func:`timed_forward`, which our worker
calls too, so both are timed by the same code over the same span).

Under tensor parallelism a rank's collectives spin while it waits for the other ranks, so a profiler's GPU busy
times mix work and waiting, and the profiler itself slows the host loop several-fold. This records, for every
decode step of ``forward_batch_generation`` (the call that launches the step's work), host timestamps at its entry
and exit and CUDA events before and after it on the stream it launches on, and reads the events only once they
have completed (no synchronisation). Per step it reports:

- ``host period``: from one decode step's call to the next (the scheduler loop's period);
- ``host in forward``: the time inside ``forward_batch_generation`` (launching the step);
- ``gpu step``: the stream's span from the step's start to its end (under overlap scheduling SGLang's forward
  stream; the draft, verify and draft-extend work joins it before the end): a span, not busy time, so gaps where
  the GPU waits for the host between the step's stages, and collectives waiting for other ranks, count in it;
- ``gpu idle``: the stream's time from one step's end to the next step's start: the GPU waiting for the host to
  launch the next step, plus SGLang's small kernels between steps (its payload relay and input resolution; without
  overlap scheduling all the scheduler's kernels).

A worker subclass that launches a decode step itself (ours, where the plain steps 0 runs: the state put in force,
then a plain step or SGLang's method) is timed over the same span by :func:`worker_step`. An adaptive one labels each
step with the state it runs in (:attr:`CycleTiming.state`: ``steps5``; ``steps0`` on the speculative path,
``steps0-held`` held as a non-speculative batch, ``steps0-resume`` the step that leaves steps 0), and each summary is
followed by one line of those states' periods (:meth:`CycleTiming.states_summary`): a state's cycle as the server runs
it, beside the price the cost policy learnt for it.

A rank whose host is late before a step shows the largest ``gpu idle`` while the others wait inside their
collectives (their ``gpu step`` grows); lateness inside a step shows as a larger ``gpu step`` on every rank. A
prefill between two decode steps breaks the pair (not counted).

With ``SGLANG_EAGLE_TRITON_CYCLE_PROFILE=K`` as well, the host time inside ``forward_batch_generation`` is also
profiled (``cProfile``, which slows Python calls: read it as shares, not times) and every summary is followed by the
``K`` functions of most own time and of most cumulative time over the same steps: where a host-bound step goes
(a host wait on the GPU shows as own time of the call that waits, e.g. ``Tensor.item``).
With ``SGLANG_EAGLE_TRITON_CYCLE_PROFILE_DIR=<folder>`` as well, every listed profile is also written whole into
that folder (:func:`dump_profile`), so that ``python -m bench.profile_diff`` can tally two servers' calls per decode
step function by function, callees included.

The same variable times the scheduler around every server of the process, speculative or not
(:class:`SchedulerStages`, the plugin wraps SGLang's ``Scheduler`` methods with :func:`timed_stage`): every N decode
iterations a line gives the scheduler loop's period between two decode ``run_batch`` calls and the host time of each
stage in it (``process_input_requests``, ``get_next_batch_to_run``, ``run_batch``, ``_apply_war_barrier``,
``process_batch_result``; ``rest``: the loop's own work, e.g. receiving requests and copying the batch), so a
speculative server's scheduler is compared with a no-spec server's stage by stage. The same line gives the time the
process spent in Python's garbage collector per iteration (inside whichever stage it struck), and how much of it in
full (generation 2) collections, whose cost grows with every object the process keeps (models, CUDA graph runners).
With the profile as well, every stage is profiled, ``run_batch`` included (the worker's launch listing is then part
of the scheduler's: the plugin profiles the workers apart only where no scheduler stage is timed), and listed after
each stage line.
A second line splits ``run_batch`` into the parts of :data:`RUN_BATCH_PARTS` (the future map's sequence-length
and input resolution, the worker's ``forward_batch_generation``, the batch's pinning for the overlap, the relay of
the step's outputs to the next step, the result's copy to the host; ``other``: the rest, e.g. the batch's snapshot
and restore around a speculative forward). A third line times SGLang's own functions inside the stages,
:data:`SGLANG_PARTS` (its decode preparation, forward batch, model forward, sampler, result processing and output
stream: the same code in every server, outside the wrappers a speculative server puts around them), so that two
servers' lines show whether a difference is in that code or around it. A stage called inside another (e.g. result
processing inside request handling) counts in the outer one only. Under
overlap scheduling the first decode iteration after a prefill is not counted (it holds the prefill's result
processing); collections in other threads of the process count too. With
``SGLANG_EAGLE_TRITON_CYCLE_TIMING_SCOPE=scheduler`` only the schedulers are timed (the workers' :class:`CycleTiming`
and its CUDA events left out), so that every server of a comparison carries the same instrument.
"""

from __future__ import annotations

import cProfile
import functools
import gc
import io
import itertools
import logging
import os
import pstats
import re
import statistics
import time
from collections import deque

from sgl_eagle_triton.adaptive import PAUSE_FACTOR, PAUSE_MS
from sgl_eagle_triton.config import CYCLE_PROFILE_DIR_ENV
from sgl_eagle_triton.glue.args import settings
from sgl_eagle_triton.glue.hooks import tp_rank_of

logger = logging.getLogger(__name__)


class CycleTiming:
    """``step(launch)``: runs ``launch()`` (SGLang's ``forward_batch_generation``) timed as above and returns its
    result; ``break_chain()``: the next decode step does not pair with the last (a prefill came between).
    ``event`` makes a recorded event (``torch.cuda.Event(enable_timing=True)`` recorded on the current stream:
    ``.query()``, ``.elapsed_time(other)`` in ms), ``clock`` returns seconds; ``every`` steps give one summary;
    ``profile_top`` > 0 profiles the launches and logs that many functions after each summary."""

    def __init__(self, every: int, rank: int = 0, event=None, clock=time.perf_counter, log=logger.info,
                 name: str = "EAGLE_TRITON", profile_top: int = 0):
        self.every, self.rank, self.clock, self.log, self.name = every, rank, clock, log, name
        self.profile_top = profile_top
        self.profiler = cProfile.Profile() if profile_top else None
        self.event = event or _cuda_event
        self.pending: deque = deque()  # (host enter, host exit, start event, end event, paired with the one before,
        # arm, state)
        self.last: tuple | None = None  # the last completed step
        self.sums = dict(host_period=0.0, host_in_forward=0.0, gpu_step=0.0, gpu_idle=0.0)
        self.counts = dict(paired=0, steps=0)
        self._paired = False
        # an A/B inside one server (config.AB_STEPS_ENV): the arm the worker put the step in; "" (none) otherwise
        self.arm = ""
        self.arms: dict[str, dict] = {}  # arm -> its sums since the last summary (arms_summary)
        # an adaptive server: the state the worker put the step in (e.g. "steps5", "steps0-held"); "" (none) otherwise
        self.state = ""
        self.states: dict[str, dict] = {}  # state -> its sums since the last summary (states_summary)

    def break_chain(self) -> None:
        self._paired = False

    _stepping = False  # inside step(): a nested timed launch (SGLang's method under ours) is not a step of its own

    def step(self, launch):
        if self._stepping:
            return launch()
        self._stepping = True
        try:
            return self._step(launch)
        finally:
            self._stepping = False

    def _step(self, launch):
        enter, start = self.clock(), self.event()
        try:
            if self.profiler is None or not _enable_profiler(self, f"{self.name} cycle profile, rank {self.rank}"):
                return launch()
            try:
                return launch()
            finally:
                self.profiler.disable()
        finally:
            self.pending.append((enter, self.clock(), start, self.event(), self._paired, self.arm, self.state))
            self._paired = True
            self._collect()

    def _collect(self) -> None:
        while self.pending and self.pending[0][3].query():
            enter, leave, start, end, paired, arm, state = self.pending.popleft()
            self.counts["steps"] += 1
            in_forward, gpu_step = (leave - enter) * 1e3, start.elapsed_time(end)
            self.sums["host_in_forward"] += in_forward
            self.sums["gpu_step"] += gpu_step
            for table, label in ((self.arms, arm), (self.states, state)):
                if label:
                    sums = _label_sums(table, label)
                    sums["steps"] += 1
                    sums["host_in_forward"] += in_forward
                    sums["gpu_step"] += gpu_step
            if paired and self.last is not None:
                self.counts["paired"] += 1
                period = (enter - self.last[0]) * 1e3
                self.sums["host_period"] += period
                self.sums["gpu_idle"] += self.last[3].elapsed_time(start)
                # a period belongs to the arm (the state) of the step that began it
                for table, label in ((self.arms, self.last[4]), (self.states, self.last[5])):
                    if label:
                        sums = _label_sums(table, label)
                        sums["paired"] += 1
                        sums["host_period"] += period
                        if table is self.states:  # a state's periods one by one: its median and pauses
                            sums.setdefault("periods", []).append(period)
            self.last = (enter, leave, start, end, arm, state)
            if self.counts["steps"] >= self.every:
                self.log(self.summary())
                if self.arms:
                    self.log(self.arms_summary())
                    self.arms = {}
                if self.states:
                    self.log(self.states_summary())
                    self.states = {}
                if self.profiler is not None and self.profiler.getstats():  # two summaries at once: one report
                    self.log(self.profile_report())
                    self.profiler = cProfile.Profile()
                self.sums = dict.fromkeys(self.sums, 0.0)
                self.counts = dict(paired=0, steps=0)

    def profile_report(self) -> str:
        """The profiled launches since the last report: the ``profile_top`` functions of most own time, then of most
        cumulative time (pstats' listings; the profile covers the launches of steps not yet summarised too)."""
        return _profile_report(self.profiler, self.profile_top, f"{self.name} cycle profile, rank {self.rank}")

    def arms_summary(self) -> str:
        """One line for the arms of an A/B inside this server since the last summary: per arm its mean host period
        (from each of its steps to the next step), host time in ``forward_batch_generation``, GPU step span, steps."""
        return f"{self.name} cycle timing arms, rank {self.rank}: {_labels_text(self.arms)}"

    def states_summary(self) -> str:
        """One line for the adaptive states the steps since the last summary ran in (``state``: the worker's label),
        each as an arm of :meth:`arms_summary`: what a state's cycle costs as the server runs it, beside the price the
        cost policy learnt for it (its ``rest_ms`` + ``replay_ms``)."""
        return f"{self.name} cycle timing states, rank {self.rank}: {_labels_text(self.states, spread=True)}"

    def summary(self) -> str:
        steps, paired = max(self.counts["steps"], 1), self.counts["paired"]

        def per_pair(key):
            return f"{self.sums[key] / paired:.2f} ms" if paired else "n/a"

        return (f"{self.name} cycle timing, rank {self.rank}, {self.counts['steps']} decode steps ({paired} after "
                f"another): host period {per_pair('host_period')} ({self.sums['host_in_forward'] / steps:.2f} ms in "
                f"forward_batch_generation), gpu step {self.sums['gpu_step'] / steps:.2f} ms + idle "
                f"{per_pair('gpu_idle')}")


def _label_sums(table: dict, label: str) -> dict:
    return table.setdefault(label, dict(steps=0, paired=0, host_in_forward=0.0, gpu_step=0.0, host_period=0.0))


def pause_share(periods: list[float]) -> tuple[float, float]:
    """The median of ``periods`` (ms) and the share of their sum in pauses: periods longer than the cost policy's
    pause rule (``adaptive.PAUSE_FACTOR`` x the median + ``adaptive.PAUSE_MS``), which it drops from a state's
    price."""
    median = statistics.median(periods)
    limit = PAUSE_FACTOR * median + PAUSE_MS
    total = sum(periods)
    return median, (sum(p for p in periods if p > limit) / total if total > 0 else 0.0)


def _labels_text(table: dict, spread: bool = False) -> str:
    """Per label (an arm, a state): its mean host period (from each of its steps to the next step; ``spread``: with
    the median and the share in pauses, :func:`pause_share`), host time in ``forward_batch_generation``, GPU step
    span and steps, ``" ; "``-joined."""

    def text(label, sums):
        steps, paired = max(sums["steps"], 1), sums["paired"]
        period = f"{sums['host_period'] / paired:.3f} ms" if paired else "n/a"
        if spread and sums.get("periods"):
            median, paused = pause_share(sums["periods"])
            period += f" (median {median:.3f} ms, {paused:.3f} in pauses)"
        return (f"{label}: host period {period}, in forward {sums['host_in_forward'] / steps:.3f} ms, gpu step "
                f"{sums['gpu_step'] / steps:.3f} ms, {sums['steps']} steps")

    return " ; ".join(text(label, sums) for label, sums in sorted(table.items()))


SCHEDULER_STAGES = ("process_input_requests", "get_next_batch_to_run", "run_batch", "_apply_war_barrier",
                    "process_batch_result")  # glue.hooks.wrap_scheduler_stages wraps these SGLang Scheduler methods
# the SGLang functions run_batch calls that the cycle timing times as its parts (glue.hooks.wrap_parts)
RUN_BATCH_PARTS = ("resolve_seq_lens_cpu", "resolve_forward_inputs", "forward_batch_generation",
                   "record_batch_in_overlap", "_relay_forward_payload", "copy_to_cpu")
# SGLang's own functions inside the stages, timed wherever a timed stage is under way (glue.hooks.SGLANG_PART_TARGETS):
# a speculative server's wrappers around them (ours included) stay outside, so that each is compared across servers
# as the same code (the memory check and decode preparation, the forward batch, the model's forward, the sampler,
# the decode result processing and its output stream)
SGLANG_PARTS = ("new_tokens_required_next_decode", "prepare_for_decode", "init_new", "model_forward", "sample",
                "process_batch_result_decode", "stream_output")
_PARTS = (*RUN_BATCH_PARTS, *SGLANG_PARTS)
GC_KEYS = ("gc", "gc_full")  # SchedulerStages: time in Python's garbage collector, all and full collections


class SchedulerStages:
    """Host time of one SGLang scheduler's stages per decode iteration (see the module's docstring).
    ``iteration(decode)`` at each ``run_batch`` entry closes the iteration since the last one (counted when both are
    decode: a prefill between breaks the chain); ``time(stage, call)`` runs ``call()`` and adds its host time to the
    open iteration. ``clock`` returns seconds; ``every`` iterations give one line; ``profile_top`` > 0 profiles every
    stage, ``run_batch`` included (SGLang's host work around the worker's ``forward_batch_generation`` and that call's
    own), and logs that many functions after each line. ``gc_callbacks``: the list this
    registers its garbage-collection timer in (Python's ``gc.callbacks``)."""

    def __init__(self, every: int, rank: int = 0, clock=time.perf_counter, log=logger.info, name: str = "no-spec",
                 profile_top: int = 0, gc_callbacks: list | None = None):
        self.every, self.rank, self.clock, self.log, self.name = every, rank, clock, log, name
        self.profile_top = profile_top
        self.profiler = cProfile.Profile() if profile_top else None
        self.open = dict.fromkeys(SCHEDULER_STAGES, 0.0)  # seconds, the iteration under way
        self.sums = dict.fromkeys(("period", *SCHEDULER_STAGES, *GC_KEYS), 0.0)  # seconds, the closed iterations
        self.count = 0
        self._entry: float | None = None  # the open iteration's decode run_batch entry (None: not in a chain)
        self.gc_open = dict.fromkeys(GC_KEYS, 0.0)  # seconds, the open iteration's collections (all, full)
        self._gc_start: float | None = None
        self._depth = 0  # stages under way (a nested stage counts in the outer one)
        self.parts_open = dict.fromkeys(_PARTS, 0.0)  # seconds, the open iteration's parts (run_batch's, SGLang's)
        self.parts = dict.fromkeys(_PARTS, 0.0)  # seconds, the closed iterations'
        self._part_depth = dict.fromkeys(_PARTS, 0)  # a part inside the same part counts once
        (gc.callbacks if gc_callbacks is None else gc_callbacks).append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = self.clock()
        elif self._gc_start is not None:
            spent, self._gc_start = self.clock() - self._gc_start, None
            self.gc_open["gc"] += spent
            if info.get("generation") == 2:
                self.gc_open["gc_full"] += spent

    def iteration(self, decode: bool) -> None:
        now = self.clock()
        if decode and self._entry is not None:
            self.count += 1
            self.sums["period"] += now - self._entry
            for key, seconds in (*self.open.items(), *self.gc_open.items()):
                self.sums[key] += seconds
            for key, seconds in self.parts_open.items():
                self.parts[key] += seconds
            if self.count >= self.every:
                self.log(self.summary())
                self.log(self.parts_summary())
                self.log(self.sglang_parts_summary())
                if self.profiler is not None and self.profiler.getstats():
                    self.log(_profile_report(self.profiler, self.profile_top,
                                             f"{self.name} scheduler profile, rank {self.rank}"))
                    self.profiler = cProfile.Profile()
                self.sums = dict.fromkeys(self.sums, 0.0)
                self.parts = dict.fromkeys(self.parts, 0.0)
                self.count = 0
        self.open = dict.fromkeys(SCHEDULER_STAGES, 0.0)
        self.parts_open = dict.fromkeys(_PARTS, 0.0)
        self.gc_open = dict.fromkeys(GC_KEYS, 0.0)
        self._entry = now if decode else None

    def time(self, stage: str, call):
        if self._depth:
            return call()
        profiler = (self.profiler if self.profiler is not None
                    and _enable_profiler(self, f"{self.name} scheduler profile, rank {self.rank}") else None)
        self._depth += 1
        start = self.clock()
        try:
            return call()
        finally:
            self._depth -= 1
            if profiler is not None:
                profiler.disable()
            self.open[stage] += self.clock() - start

    def time_part(self, part: str, call):
        """Run ``call()`` (one of :data:`RUN_BATCH_PARTS`, called inside ``run_batch``, or of :data:`SGLANG_PARTS`)
        and add its host time to the open iteration's part; a part inside the same part (a target worker's forward in
        a speculative worker's) counts once."""
        if self._part_depth[part]:
            return call()
        self._part_depth[part] += 1
        start = self.clock()
        try:
            return call()
        finally:
            self._part_depth[part] -= 1
            self.parts_open[part] += self.clock() - start

    def parts_summary(self) -> str:
        count = max(self.count, 1)
        ms = {part: self.parts[part] * 1e3 / count for part in RUN_BATCH_PARTS}
        other = self.sums["run_batch"] * 1e3 / count - sum(ms.values())
        parts = " + ".join(f"{part} {ms[part]:.3f}" for part in RUN_BATCH_PARTS)
        return (f"{self.name} run_batch parts, rank {self.rank}, {self.count} decode iterations: {parts} + other "
                f"{other:.3f} (ms)")

    def sglang_parts_summary(self) -> str:
        count = max(self.count, 1)
        parts = " + ".join(f"{part} {self.parts[part] * 1e3 / count:.3f}" for part in SGLANG_PARTS)
        return f"{self.name} sglang parts, rank {self.rank}, {self.count} decode iterations: {parts} (ms)"

    def summary(self) -> str:
        count = max(self.count, 1)
        ms = {key: value * 1e3 / count for key, value in self.sums.items()}
        rest = ms["period"] - sum(ms[stage] for stage in SCHEDULER_STAGES)
        stages = " + ".join(f"{stage} {ms[stage]:.3f}" for stage in SCHEDULER_STAGES)
        return (f"{self.name} scheduler stages, rank {self.rank}, {self.count} decode iterations: period "
                f"{ms['period']:.3f} ms = {stages} + rest {rest:.3f} (ms); garbage collection {ms['gc']:.3f} ms, "
                f"full {ms['gc_full']:.3f} ms")


_SUMMARY = re.compile(
    r"(?P<name>\S+) cycle timing, rank (?P<rank>\d+), (?P<steps>\d+) decode steps \((?P<paired>\d+) after "
    r"another\): host period (?P<host_period>n/a|[\d.]+ ms) \((?P<host_in_forward>[\d.]+) ms in "
    r"forward_batch_generation\), gpu step (?P<gpu_step>[\d.]+) ms \+ idle (?P<gpu_idle>n/a|[\d.]+ ms)")


def _enable_profiler(owner, title: str) -> bool:
    """Start ``owner.profiler`` (a :class:`CycleTiming`'s or :class:`SchedulerStages`'s, not None); where another
    profiler holds the interpreter (Python >= 3.12 refuses a second one), log it once through ``owner.log`` and
    profile no more: a diagnostic never fails a step."""
    try:
        owner.profiler.enable()
        return True
    except ValueError as error:
        owner.log(f"{title}: off ({error})")
        owner.profiler = None
        return False


def _profile_report(profiler: cProfile.Profile, top: int, title: str) -> str:
    """``profiler``'s ``top`` functions of most own time, then of most cumulative time (pstats' listings); where
    :data:`config.CYCLE_PROFILE_DIR_ENV` names a folder, the whole profile is also written there
    (:func:`dump_profile`)."""
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    folder = os.environ.get(CYCLE_PROFILE_DIR_ENV)
    if folder:
        dump_profile(stats, folder, title)
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(top)
    return f"{title}, by own then cumulative time:\n{text.getvalue()}"


_DUMPS = itertools.count()


def dump_profile(stats: pstats.Stats, folder: str, title: str) -> str | None:
    """Write ``stats`` whole (``pstats.Stats.dump_stats``) into ``folder`` as ``<title as a name>-pid<pid>-<n>.prof``
    (``n`` counts this process's dumps); a diagnostic never fails a step: an unwritable folder is logged once and
    nothing more is written. Returns the file's path, or None."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()
    path = os.path.join(folder, f"{name}-pid{os.getpid()}-{next(_DUMPS)}.prof")
    try:
        stats.dump_stats(path)
    except OSError as error:
        logger.warning("%s: cannot keep the profile in %s (%s); unset %s", title, folder, error,
                       CYCLE_PROFILE_DIR_ENV)
        os.environ.pop(CYCLE_PROFILE_DIR_ENV, None)
        return None
    return path


_STAGE_SUMMARY = re.compile(
    r"(?P<name>\S+) scheduler stages, rank (?P<rank>\d+), (?P<count>\d+) decode iterations: period "
    r"(?P<period>[\d.]+) ms = (?P<stages>.*?) \(ms\); garbage collection (?P<gc>[\d.]+) ms, full "
    r"(?P<gc_full>[\d.]+) ms")


def parse_stage_summaries(text: str) -> list[dict]:
    """Every :meth:`SchedulerStages.summary` line in ``text``: ``name`` (the speculative algorithm or no-spec),
    ``rank``, ``count`` and ``period`` / each stage / ``rest`` / ``gc`` / ``gc_full`` in ms."""
    rows = []
    for m in _STAGE_SUMMARY.finditer(text):
        rows.append(dict(name=m["name"], rank=int(m["rank"]), count=int(m["count"]), period=float(m["period"]),
                         gc=float(m["gc"]), gc_full=float(m["gc_full"]), **_named_values(m["stages"])))
    return rows


def _named_values(text: str) -> dict:
    """``"a 0.100 + b 2.000"`` (a summary line's sum) as ``{"a": 0.1, "b": 2.0}``."""
    return {name: float(value) for name, value in (term.rsplit(" ", 1) for term in text.split(" + "))}


_PARTS_SUMMARY = re.compile(
    r"(?P<name>\S+) run_batch parts, rank (?P<rank>\d+), (?P<count>\d+) decode iterations: (?P<parts>.*?) \(ms\)")


def parse_parts_summaries(text: str) -> list[dict]:
    """Every :meth:`SchedulerStages.parts_summary` line in ``text``: ``name``, ``rank``, ``count`` and each of
    :data:`RUN_BATCH_PARTS` and ``other`` (the rest of ``run_batch``) in ms."""
    return [dict(name=m["name"], rank=int(m["rank"]), count=int(m["count"]), **_named_values(m["parts"]))
            for m in _PARTS_SUMMARY.finditer(text)]


_SGLANG_PARTS_SUMMARY = re.compile(
    r"(?P<name>\S+) sglang parts, rank (?P<rank>\d+), (?P<count>\d+) decode iterations: (?P<parts>.*?) \(ms\)")


def parse_sglang_parts_summaries(text: str) -> list[dict]:
    """Every :meth:`SchedulerStages.sglang_parts_summary` line in ``text``: ``name``, ``rank``, ``count`` and each of
    :data:`SGLANG_PARTS` in ms."""
    return [dict(name=m["name"], rank=int(m["rank"]), count=int(m["count"]), **_named_values(m["parts"]))
            for m in _SGLANG_PARTS_SUMMARY.finditer(text)]


def parse_summaries(text: str) -> list[dict]:
    """Every :meth:`CycleTiming.summary` line in ``text`` (e.g. a server log): ``name`` (the algorithm), ``rank``,
    ``steps``, ``paired`` and ``host_period`` / ``host_in_forward`` / ``gpu_step`` / ``gpu_idle`` in ms (None where
    the line says n/a)."""

    def ms(value: str):
        return None if value == "n/a" else float(value.removesuffix(" ms"))

    return [dict(name=m["name"], rank=int(m["rank"]), steps=int(m["steps"]), paired=int(m["paired"]),
                 **{key: ms(m[key]) for key in ("host_period", "host_in_forward", "gpu_step", "gpu_idle")})
            for m in _SUMMARY.finditer(text)]


_ARMS_SUMMARY = re.compile(r"(?P<name>\S+) cycle timing arms, rank (?P<rank>\d+): (?P<arms>.*)")
_STATES_SUMMARY = re.compile(r"(?P<name>\S+) cycle timing states, rank (?P<rank>\d+): (?P<arms>.*)")
_ARM = re.compile(r"(?P<arm>[\w-]+): host period (?P<host_period>n/a|[\d.]+ ms)"
                  r"(?: \(median (?P<median>[\d.]+) ms, (?P<paused>[\d.]+) in pauses\))?, in forward "
                  r"(?P<host_in_forward>[\d.]+) ms, gpu step (?P<gpu_step>[\d.]+) ms, (?P<steps>\d+) steps")


def parse_arm_summaries(text: str, states: bool = False) -> list[dict]:
    """Every :meth:`CycleTiming.arms_summary` line in ``text`` (``states``: every :meth:`CycleTiming.states_summary`
    line, its states as arms): ``name``, ``rank`` and ``arms``: {arm: {``steps``, ``host_period`` (None where n/a),
    ``host_in_forward``, ``gpu_step`` in ms; a state's also ``median_period`` (ms) and ``paused`` (the share of its
    periods' time in pauses) where its line gives them}}."""
    rows = []
    for m in (_STATES_SUMMARY if states else _ARMS_SUMMARY).finditer(text):
        arms = {}
        for a in _ARM.finditer(m["arms"]):
            arms[a["arm"]] = dict(steps=int(a["steps"]), host_in_forward=float(a["host_in_forward"]),
                                  gpu_step=float(a["gpu_step"]),
                                  host_period=None if a["host_period"] == "n/a" else float(a["host_period"][:-3]))
            if a["median"] is not None:
                arms[a["arm"]].update(median_period=float(a["median"]), paused=float(a["paused"]))
        rows.append(dict(name=m["name"], rank=int(m["rank"]), arms=arms))
    return rows


ACTIVE = False  # a timed wrapper was made in this process (timed_forward, timed_stage): worker_step may time a step


def timed_forward(forward, every: int, make_timing=CycleTiming, profile_top: int = 0):
    """``forward`` (SGLang's ``EAGLEWorkerV2.forward_batch_generation(self, batch, ...)``) with its decode steps timed
    by one :class:`CycleTiming` per worker (made at its first call: the worker's TP rank (glue.hooks.tp_rank_of), its
    ``server_args.speculative_algorithm``, ``profile_top`` as given). A prefill breaks the chain and is not timed, nor
    is an idle batch."""

    global ACTIVE
    ACTIVE = True

    @functools.wraps(forward)
    def timed(self, batch, *args, **kwargs):
        timing = _timer_of(self, "_cycle_timing", make_timing, every, profile_top, "EAGLE")
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            timing.break_chain()
            return forward(self, batch, *args, **kwargs)
        if batch.forward_mode.is_idle():
            return forward(self, batch, *args, **kwargs)
        return timing.step(lambda: forward(self, batch, *args, **kwargs))

    timed.sgl_eagle_triton_timed = True
    # the worker's timer, for a decode step the worker launches itself (worker_step)
    timed.sgl_eagle_triton_timer = lambda owner: _timer_of(owner, "_cycle_timing", make_timing, every, profile_top,
                                                           "EAGLE")
    return timed


def worker_step(worker, parent_forward, call):
    """``call()``: a decode step an EAGLE worker subclass launches from its own ``forward_batch_generation`` (around or
    instead of SGLang's ``parent_forward``), timed as SGLang's method is: by the worker's :class:`CycleTiming` where
    ``parent_forward`` is :func:`timed_forward`'s wrapper, and as ``run_batch``'s ``forward_batch_generation`` part
    inside a timed ``run_batch``; SGLang's timed method called inside counts once (re-entrant step, nested part)."""
    make = getattr(parent_forward, "sgl_eagle_triton_timer", None)
    timing = make(worker) if make is not None else None
    timed = (lambda: timing.step(call)) if timing is not None else call
    return _RUNNING[-1].time_part("forward_batch_generation", timed) if _RUNNING else timed()


def _timer_of(owner, attribute: str, make, every: int, profile_top: int, default_name: str):
    """``owner``'s timer kept as ``attribute`` (an SGLang worker's or scheduler's), made at the first call as
    ``make(every, rank=<its TP rank (glue.hooks.tp_rank_of)>, name=<its server_args.speculative_algorithm, else
    default_name>, profile_top=profile_top)``."""
    timer = owner.__dict__.get(attribute)
    if timer is None:
        sa = getattr(owner, "server_args", None)
        name = str(getattr(settings(sa) if sa is not None else None, "speculative_algorithm", None) or default_name)
        timer = make(every, rank=tp_rank_of(owner), name=name, profile_top=profile_top)
        setattr(owner, attribute, timer)
    return timer


def timed_stage(stage: str, method, every: int, make_stages=SchedulerStages, profile_top: int = 0):
    """``method`` (SGLang's ``Scheduler.<stage>(self, ...)``, one of :data:`SCHEDULER_STAGES`) timed by one
    :class:`SchedulerStages` per scheduler (made at its first timed call: its TP rank (glue.hooks.tp_rank_of), its
    ``server_args.speculative_algorithm`` or ``no-spec``). ``run_batch`` first closes the iteration: decode when its
    batch's ``forward_mode.is_decode()`` (a prefill, an idle or mixed batch breaks the chain)."""
    global ACTIVE
    ACTIVE = True

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        stages = _timer_of(self, "_stage_timing", make_stages, every, profile_top, "no-spec")
        running = stage == "run_batch"
        if running:
            batch = args[0] if args else kwargs.get("batch")
            stages.iteration(_is_decode(batch))
            _RUNNING.append(stages)
        _IN_STAGE.append(stages)
        try:
            return stages.time(stage, lambda: method(self, *args, **kwargs))
        finally:
            _IN_STAGE.pop()
            if running:
                _RUNNING.pop()

    timed.sgl_eagle_triton_timed = True
    return timed


_RUNNING: list = []  # the SchedulerStages whose run_batch is under way (one scheduler per process; a stack)
_IN_STAGE: list = []  # the SchedulerStages whose timed stage (any) is under way


def timed_part(part: str, function):
    """``function`` (SGLang's) timed as that part of the running scheduler's iteration
    (:meth:`SchedulerStages.time_part`): one of :data:`RUN_BATCH_PARTS` inside ``Scheduler.run_batch``, one of
    :data:`SGLANG_PARTS` inside any timed stage; called outside them, untimed."""
    stack = _RUNNING if part in RUN_BATCH_PARTS else _IN_STAGE

    @functools.wraps(function)
    def timed(*args, **kwargs):
        if not stack:
            return function(*args, **kwargs)
        return stack[-1].time_part(part, lambda: function(*args, **kwargs))

    timed.sgl_eagle_triton_part = True
    return timed


def _is_decode(batch) -> bool:
    mode = getattr(batch, "forward_mode", None)
    return bool(mode is not None and mode.is_decode() and not getattr(batch, "is_extend_in_batch", False))


_DEVICE_INDEX = []  # this process's CUDA device, found at the first event


def _cuda_event():
    """A timing event recorded on the current stream, asked of the device by index (torch's lookup of the current
    device, which a bare ``record()`` makes, is ~10 Python calls: it would inflate what it times)."""
    import torch

    if not _DEVICE_INDEX:
        _DEVICE_INDEX.append(torch.cuda.current_device())
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(_DEVICE_INDEX[0]))
    return event
