"""The glue layer against the installed SGLang (every served release runs these: .ci/run's lanes): the start-up check
passes on it, and refuses, naming what moved, an SGLang outside the served releases, a moved call site, a missing
name, a changed signature, a keyword our replacements or overrides would not take, and a hook target that changed."""

import functools
import re
from types import SimpleNamespace

import pytest
import sglang
from sglang.srt.speculative import eagle_utils, eagle_worker_common
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from sgl_eagle_triton import config, plugin, worker
from sgl_eagle_triton.glue import args, call_sites, hooks, versions
from sgl_eagle_triton.worker import EagleTritonWorkerV2, TritonEagleDraftWorker

CLASSES = (TritonEagleDraftWorker, EagleTritonWorkerV2)


def _check():
    call_sites.check_glue(worker.REPLACEMENTS, CLASSES)


def test_the_installed_sglang_is_served_and_every_touchpoint_holds():
    assert versions.unsupported_reason() is None and versions.installed() == sglang.__version__
    assert versions.installed() in versions.CPU_CHECKED
    assert call_sites.glue_problems(worker.REPLACEMENTS, CLASSES) == []
    _check()
    assert all(call_sites.reaches(getattr(owner, attr), module, name)
               for owner, attr, module, name in call_sites.CALL_SITES)


@pytest.mark.parametrize("version", ["0.5.16", "0.5.24", "0.6.0"])
def test_an_sglang_outside_the_served_releases_is_refused_at_start(monkeypatch, version):
    monkeypatch.setattr(versions, "installed", lambda: version)
    served = re.escape(f"SGLang {version} is outside the releases sgl-eagle-triton serves (0.5.17 ... 0.5.23)")
    with pytest.raises(versions.UnsupportedSGLangError, match=served):
        EagleTritonWorkerV2()  # the check runs before anything else is built
    with pytest.raises(versions.UnsupportedSGLangError, match=served + r".*pip install 'sglang>=0.5.17,<=0.5.23'"):
        config.validate_before_defaults(SimpleNamespace(speculative_adaptive=False))


def test_outside_the_served_releases_the_plugin_registers_only_a_refusal(monkeypatch):
    """register() on an unserved SGLang applies no hook and registers EAGLE_TRITON with a validator that refuses."""
    registered, applied = {}, []
    monkeypatch.setattr(versions, "installed", lambda: "0.5.24")
    monkeypatch.setattr(plugin, "get_spec", lambda name: None)
    monkeypatch.setattr(plugin, "_register_hooks", lambda: applied.append(True))
    monkeypatch.setattr(plugin.SpeculativeAlgorithm, "register",
                        lambda name, **kwargs: (registered.update(kwargs), lambda factory: None)[1])
    plugin.register()
    assert not applied
    with pytest.raises(versions.UnsupportedSGLangError, match="0.5.17 ... 0.5.23"):
        registered["validate_server_args"](SimpleNamespace())


def _stock_verify_that_moved_its_sampling(self, batch, grammar_barrier=None):
    return eagle_utils.eagle_sample(None, batch, None)  # no longer through eagle_worker_common.eagle_sample


def _draft_forward_renamed(self, batch):
    return self.draft_forward_v3(batch)


@pytest.mark.parametrize("owner, method, replacement, named", [
    (EAGLEWorkerV2, "verify", _stock_verify_that_moved_its_sampling, "eagle_worker_common.eagle_sample"),
    (EagleDraftWorker, "draft", _draft_forward_renamed, "the method draft_forward"),
])
def test_a_moved_call_site_refuses_to_start(monkeypatch, owner, method, replacement, named):
    monkeypatch.setattr(owner, method, replacement)
    with pytest.raises(RuntimeError) as err:
        EagleTritonWorkerV2()
    message = str(err.value)
    assert f"SGLang {sglang.__version__}" in message and "Served releases: 0.5.17 ... 0.5.23" in message
    assert re.search(rf"{owner.__module__}\.{owner.__qualname__}\.{method} no longer reaches [\w.]*{named}", message)


def test_a_wrapped_method_that_still_calls_through_passes(monkeypatch):
    original = EAGLEWorkerV2.verify

    @functools.wraps(original)
    def timed(self, *args, **kwargs):  # e.g. another plugin's AROUND hook
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EAGLEWorkerV2, "verify", timed)
    _check()


@pytest.mark.parametrize("module, name", [(eagle_utils, "_verify_coins"), (eagle_worker_common, "eagle_sample")])
def test_a_missing_name_refuses_to_start(monkeypatch, module, name):
    monkeypatch.delattr(module, name)
    with pytest.raises(RuntimeError, match=rf"{module.__name__.split('.')[-1]}\.{name} \(missing\)"):
        _check()


def test_a_renamed_argument_refuses_to_start(monkeypatch):
    """As 0.5.18 dropped resolve_num_tokens_per_req's server_args: a signature none of our variants handles."""
    def coins(sampling_info, seq_lens, num_draft_tokens, candidates, device):  # draft_token_num renamed
        return None

    monkeypatch.setattr(eagle_utils, "_verify_coins", coins)
    with pytest.raises(RuntimeError, match=re.escape("eagle_utils._verify_coins takes (sampling_info, seq_lens, "
                                                     "num_draft_tokens, candidates, device), not (sampling_info")):
        _check()


def test_a_keyword_sglang_starts_passing_that_our_replacement_lacks_refuses_to_start(monkeypatch):
    """As 0.5.20 / 0.5.22 began passing uno_target_max_top_k / watermark_state to eagle_sample: ours must take every
    parameter SGLang's takes (it takes those), else the server is refused at start, not at its first verify."""
    stock = eagle_utils.eagle_sample

    def grown(verify_input, batch, logits_output, grammar_mask=None, *, speculative_budget=None):
        return stock(verify_input, batch, logits_output, grammar_mask)

    monkeypatch.setattr(eagle_worker_common, "eagle_sample", grown)
    with pytest.raises(RuntimeError, match="our replacement of .*eagle_worker_common.eagle_sample does not take "
                       "speculative_budget"):
        _check()


def test_a_parameter_sglang_passes_by_a_new_name_refuses_to_start(monkeypatch):
    """SGLang calls verify_tree_greedy_func with keywords: a renamed parameter our replacement lacks is refused."""
    def renamed(predict, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
                retrieve_next_sibling, target_predict, topk=-1):
        return None

    monkeypatch.setattr(eagle_utils, "verify_tree_greedy_func", renamed)
    assert any(p.endswith("eagle_utils.verify_tree_greedy_func does not take predict")
               for p in call_sites.glue_problems(worker.REPLACEMENTS, CLASSES))


def test_an_override_that_drops_a_keyword_sglang_passes_refuses_to_start(monkeypatch):
    """As 0.5.22's forward_batch_generation passes kv_loc_plan= to _draft_extend_for_decode."""
    def extend(self, batch, batch_result, *, kv_loc_plan=None, fused_plan=None):
        return None

    monkeypatch.setattr(EagleDraftWorker, "_draft_extend_for_decode", extend)
    assert call_sites.glue_problems(worker.REPLACEMENTS, CLASSES) == []  # ours passes keywords through

    class Narrow(EagleDraftWorker):
        def _draft_extend_for_decode(self, batch, batch_result):
            return None

    assert call_sites.glue_problems({}, (Narrow,)) == [
        f"our override {Narrow.__qualname__}._draft_extend_for_decode does not take kv_loc_plan, fused_plan"]


def test_a_hook_target_that_changed_refuses_to_start(monkeypatch):
    from sglang.srt.speculative import adaptive_spec_params

    monkeypatch.setattr(adaptive_spec_params, "adaptive_unsupported_reason", lambda config_bag, strict: None)
    with pytest.raises(RuntimeError, match=re.escape("adaptive_unsupported_reason takes (config_bag, strict), not "
                                                     "(server_args)")):
        _check()


def test_every_hook_target_resolves_and_takes_what_our_hook_reads():
    assert hooks.hook_problems() == []
    assert set(hooks.HOOKS) == {"req_to_token_headroom", "report_kernels", "adaptive_reason", "shared_logits_rows",
                                "verify_attention_backend"}


@pytest.mark.parametrize("version, parsed", [("0.5.17", (0, 5, 17)), ("0.5.21.post1", (0, 5, 21)),
                                             ("0.5.23rc1", (0, 5, 23)), ("0.5.23+cu130", (0, 5, 23))])
def test_release_numbers(version, parsed):
    assert versions.release(version) == parsed


@pytest.mark.parametrize("version, flag", [("0.5.17", "--cuda-graph-max-bs"), ("0.5.19", "--cuda-graph-max-bs"),
                                           ("0.5.20", "--cuda-graph-max-bs-decode"),
                                           ("0.5.23", "--cuda-graph-max-bs-decode")])
def test_the_decode_graph_cap_flag_of_each_release(version, flag):
    assert versions.cuda_graph_max_bs_flag(version) == flag


def test_settings_read_what_sglang_resolved():
    """A record from the command line, resolved as a launcher does it: its settings say what SGLang decided (from
    0.5.19 the record itself keeps the raw input: steps None)."""
    from sglang.srt.plugins import load_plugins

    from tests.tiny_models import TRAINED_PAIR

    load_plugins()
    record = args.prepare_server_args(["--model-path", str(TRAINED_PAIR / "target"), "--device", "cpu",
                                       "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                       str(TRAINED_PAIR / "eagle3"), "--speculative-num-steps", "3",
                                       "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"])
    view = args.settings(record)
    assert (view.speculative_num_steps, view.speculative_eagle_topk, view.speculative_num_draft_tokens) == (3, 1, 4)
    assert args.Overlay(record, speculative_eagle_topk=7).speculative_eagle_topk == 7
    assert args.Overlay(record).speculative_num_steps == 3
    other = args.with_fields(record, speculative_eagle_topk=7)  # up to 0.5.18 a copy, its declarations kept
    assert (other.speculative_eagle_topk, other.speculative_num_steps) == (7, 3)
    assert args.settings(record).speculative_eagle_topk == 1


def test_the_refusals_above_come_from_the_checks(monkeypatch):
    """Mutations: without the signature table, the renamed argument passes; without the replacements' parameters,
    the new keyword passes; without the hook table, the changed hook target passes (so the tests above fail)."""
    def coins(sampling_info, seq_lens, num_draft_tokens, candidates, device):
        return None

    def grown(verify_input, batch, logits_output, grammar_mask=None, *, speculative_budget=None):
        return None

    from sglang.srt.speculative import adaptive_spec_params

    monkeypatch.setattr(eagle_utils, "_verify_coins", coins)
    monkeypatch.setattr(eagle_worker_common, "eagle_sample", grown)
    monkeypatch.setattr(adaptive_spec_params, "adaptive_unsupported_reason", lambda config_bag, strict: None)
    assert len(call_sites.glue_problems(worker.REPLACEMENTS, CLASSES)) == 3
    monkeypatch.setattr(call_sites, "SIGNATURES", ())
    monkeypatch.setattr(hooks, "HOOKS", {})
    assert call_sites.glue_problems({}, CLASSES) == []


def test_the_algorithm_name_in_any_letter_case_is_ours():
    """SGLang matches algorithm names case-insensitively, and from 0.5.19 a record keeps the name as typed: the hooks
    that act for EAGLE_TRITON servers only must recognise ``eagle_triton`` too."""
    assert config.is_ours(SimpleNamespace(speculative_algorithm="eagle_triton"))
    assert config.is_ours(SimpleNamespace(speculative_algorithm="EAGLE_TRITON"))
    assert not config.is_ours(SimpleNamespace(speculative_algorithm="EAGLE3"))
    assert not config.is_ours(SimpleNamespace(speculative_algorithm=None))


def _restored_after_the_test(monkeypatch, part_targets: dict) -> None:
    """Every SGLang function of ``part_targets`` (glue.hooks' part tables) put back as it is now after the test."""
    from sgl_eagle_triton.glue.hooks import part_target

    for targets in part_targets.values():
        for target in targets:
            owner, name, function = part_target(target)
            monkeypatch.setattr(owner, name, function)


def test_the_run_batch_parts_the_cycle_timing_wraps_are_this_sglangs(monkeypatch):
    """SGLANG_EAGLE_TRITON_CYCLE_TIMING times these SGLang functions as parts of run_batch
    (glue.hooks.wrap_parts): each exists here and is replaced once (a second call finds them wrapped)."""
    from sgl_eagle_triton.cycle_timing import RUN_BATCH_PARTS
    from sgl_eagle_triton.glue.hooks import RUN_BATCH_PART_TARGETS, wrap_parts

    assert set(RUN_BATCH_PART_TARGETS) == set(RUN_BATCH_PARTS)
    _restored_after_the_test(monkeypatch, RUN_BATCH_PART_TARGETS)
    wrapped = []

    def wrap(part, function):
        wrapped.append(part)
        marked = lambda *a, **k: function(*a, **k)  # noqa: E731
        marked.marker = True
        return marked

    assert wrap_parts(RUN_BATCH_PARTS, wrap, "marker") == []
    assert sorted(wrapped) == sorted(part for part, targets in RUN_BATCH_PART_TARGETS.items() for _ in targets)
    assert wrap_parts(RUN_BATCH_PARTS, wrap, "marker") is None


def test_the_sglang_parts_the_cycle_timing_wraps_are_this_sglangs(monkeypatch):
    """SGLang's own functions the cycle timing times inside the stages (cycle_timing.SGLANG_PARTS) exist here and are
    replaced once; a classmethod (ForwardBatch.init_new) stays one, its wrapper called with the class."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sgl_eagle_triton.cycle_timing import SGLANG_PARTS
    from sgl_eagle_triton.glue.hooks import SGLANG_PART_TARGETS, wrap_parts

    assert set(SGLANG_PART_TARGETS) == set(SGLANG_PARTS)
    _restored_after_the_test(monkeypatch, SGLANG_PART_TARGETS)
    called = []

    def wrap(part, function):
        def marked(*a, **k):
            called.append((part, a[:1]))
            return "ran"

        marked.marker = True
        return marked

    assert wrap_parts(SGLANG_PARTS, wrap, "marker", SGLANG_PART_TARGETS) == []
    assert isinstance(ForwardBatch.__dict__["init_new"], classmethod)
    assert ForwardBatch.init_new("batch") == "ran" and called == [("init_new", (ForwardBatch,))]
    assert wrap_parts(SGLANG_PARTS, wrap, "marker", SGLANG_PART_TARGETS) is None


def test_the_scheduler_stages_the_cycle_timing_wraps_are_this_sglangs():
    """SGLANG_EAGLE_TRITON_CYCLE_TIMING wraps these Scheduler methods (glue.hooks.wrap_scheduler_stages); run_batch's
    first argument is the batch whose forward mode closes an iteration."""
    import inspect

    from sglang.srt.managers.scheduler import Scheduler

    from sgl_eagle_triton.cycle_timing import SCHEDULER_STAGES

    for stage in SCHEDULER_STAGES:
        assert callable(getattr(Scheduler, stage, None)), stage
    assert list(inspect.signature(Scheduler.run_batch).parameters)[:2] == ["self", "batch"]


def test_the_workers_draft_worker_reads_what_sglangs_property_reads():
    """The worker's ``draft_worker`` (glue.call_sites.draft_worker_property, a C getter) is this SGLang's
    ``BaseSpecWorker.draft_worker`` of the same worker."""
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

    from sgl_eagle_triton.worker import EagleTritonWorkerV2

    w = EagleTritonWorkerV2.__new__(EagleTritonWorkerV2)
    w._draft_worker = object()
    assert w.draft_worker is BaseSpecWorker.draft_worker.fget(w) is w._draft_worker


def test_the_glue_check_reads_a_timed_classmethods_own_signature(monkeypatch):
    """Under the cycle timing ForwardBatch.init_new is a classmethod of a wrapper of its function: the worker's
    start-up check of SGLang's signatures (plain steps 0's) still reads (batch, model_runner, ...), not cls first
    (a server refused at start before hooks.parameters dropped it)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sgl_eagle_triton.cycle_timing import timed_part
    from sgl_eagle_triton.glue.call_sites import PLAIN_OFF_SIGNATURES
    from sgl_eagle_triton.glue.hooks import SGLANG_PART_TARGETS, signature_problem, wrap_parts

    monkeypatch.setattr(ForwardBatch, "init_new", ForwardBatch.__dict__["init_new"])  # restored after the test
    assert wrap_parts(["init_new"], timed_part, "sgl_eagle_triton_part", SGLANG_PART_TARGETS) == []
    variants = next(v for owner, name, v in PLAIN_OFF_SIGNATURES if owner is ForwardBatch and name == "init_new")
    assert ForwardBatch.__dict__["init_new"].__func__.sgl_eagle_triton_part
    assert signature_problem(ForwardBatch.init_new, variants) is None
