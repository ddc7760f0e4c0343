"""The fla agreement check of the sanity phase, with stand-in `fla` modules (fla is Triton: no CPU kernels), and the
background compiles' behaviour on a CPU and on failure."""

import sys
import types

import pytest
import torch

from soarpack.quant.glacheck import FLA_AGREEMENT_RTOL, FlaComparison, judge, should_compare
from soarpack.quant.warmup import Warmups, start_warmups
from soarpack.sala.checkpoint import load_model
from soarpack.sala.gla import chunk_gla, observe_torch_path, use_backend
from soarpack.sala.streaming import model_source, streamed_logits

ROWS = [list(range(5, 150)), list(range(200, 233))]


def _agreeing(q, k, v, g, scale, initial_state=None, output_final_state=True):
    return chunk_gla(q, k, v, g[0, 0], scale, initial_state)


def _wrong(q, k, v, g, scale, initial_state=None, output_final_state=True):
    return chunk_gla(q, k, v, torch.zeros_like(g[0, 0]), scale, initial_state)  # forgets the decay


def _raising(*args, **kwargs):
    raise ValueError("head_first is no longer supported")


@pytest.fixture
def stand_in_fla(monkeypatch):
    def install(fn):
        ops = types.ModuleType("fla.ops.simple_gla")
        ops.chunk_simple_gla = ops.fused_recurrent_simple_gla = fn
        for name, module in (("fla", types.ModuleType("fla")), ("fla.ops", types.ModuleType("fla.ops")),
                             ("fla.ops.simple_gla", ops)):
            monkeypatch.setitem(sys.modules, name, module)
    return install


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_model(tiny_model_dir, dtype=torch.bfloat16)


def _verdict(model):
    """What the sanity phase does on a GPU: the torch stream, with fla run beside every GLA call."""
    comparison = FlaComparison()
    with use_backend("torch"), observe_torch_path(comparison):
        logits = streamed_logits(model.config, model_source(model), ROWS, "cpu")
    assert len(logits) == len(ROWS)
    return judge(comparison)


def test_agreeing_fla_is_kept(stand_in_fla, model):
    stand_in_fla(_agreeing)
    with use_backend("fla"):
        assert should_compare("cuda:0")
        verdict = _verdict(model)
    assert verdict.backend == "fla" and not verdict.problem
    lightning = sum(1 for m in model.config.mixer_types if m != "minicpm4")
    assert verdict.calls == lightning * len(ROWS) and verdict.rel_diff < FLA_AGREEMENT_RTOL


def test_wrong_fla_sends_the_run_to_torch(stand_in_fla, model):
    stand_in_fla(_wrong)
    verdict = _verdict(model)
    assert verdict.backend == "torch"
    assert verdict.rel_diff > FLA_AGREEMENT_RTOL and "disagrees" in verdict.problem


def test_raising_fla_sends_the_run_to_torch(stand_in_fla, model):
    stand_in_fla(_raising)
    verdict = _verdict(model)
    assert verdict.backend == "torch" and "head_first" in verdict.problem and verdict.rel_diff is None


def test_nothing_compared_keeps_the_backend_in_force():
    assert judge(None).backend == "torch" and judge(FlaComparison()).problem == ""
    with use_backend("fla"):
        assert judge(None).backend == "fla"


def test_cpu_runs_compare_nothing_and_compile_nothing(stand_in_fla, model):
    stand_in_fla(_agreeing)
    assert not should_compare("cpu")
    warmups = start_warmups("cpu", model.config, "torch")
    assert warmups.threads == {} and warmups.wait_all() == []


def test_the_default_gla_needs_no_fla_check(stand_in_fla):
    """fla importable on a GPU is not enough: only a run that asked for fla compares (and compiles) it."""
    stand_in_fla(_agreeing)
    with use_backend("torch"):
        assert not should_compare("cuda")
    with use_backend("fla"):
        assert should_compare("cuda") and not should_compare("cpu")


def test_a_failed_warmup_is_one_line_not_an_error():
    warmups = Warmups()
    warmups.start("ok", lambda: None)
    warmups.start("jit", lambda: (_ for _ in ()).throw(OSError("nvcc not found")))
    lines = warmups.wait_all()
    assert len(lines) == 1 and "jit warm-up failed" in lines[0] and "nvcc not found" in lines[0]
