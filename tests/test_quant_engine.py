"""The engine's process-wide switches around GPTQModel: the Hessian GEMM and the block update while it builds."""

import os
import threading
import time

import pytest
import torch

from soarpack.quant import engine
from soarpack.quant.engine import BLOCK_UPDATE_OFF, FP32_HESSIAN, eager_block_update_while

gptq = pytest.importorskip("gptqmodel.quantization.gptq")


def _bf16_batch(rows: int = 64, columns: int = 48) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rows)
    return torch.randn(rows, columns, generator=gen).to(torch.bfloat16)


def test_the_hessian_gemm_is_swapped_in_for_the_call_only(monkeypatch):
    monkeypatch.delenv(FP32_HESSIAN, raising=False)
    original = gptq.GPTQ.compute_hessian_xtx
    with engine._half_input_hessians(True):
        assert gptq.GPTQ.compute_hessian_xtx is not original
    assert gptq.GPTQ.compute_hessian_xtx is original
    with engine._half_input_hessians(False):  # GPTQModel's defaults (the baseline) keep its own
        assert gptq.GPTQ.compute_hessian_xtx is original
    monkeypatch.setenv(FP32_HESSIAN, "1")
    with engine._half_input_hessians(True):
        assert gptq.GPTQ.compute_hessian_xtx is original


def test_off_cuda_the_hessian_is_gptqmodels_own_bit_for_bit(monkeypatch):
    """mm(out_dtype=) has no CPU kernel: a CPU run must form XᵀX exactly as GPTQModel does (float32 SGEMM)."""
    monkeypatch.delenv(FP32_HESSIAN, raising=False)
    x = _bf16_batch()
    from gptqmodel import QuantizeConfig

    task = object.__new__(gptq.GPTQ)  # the two fields compute_hessian_xtx reads, without a module to wrap
    task.columns, task.qcfg = x.shape[1], QuantizeConfig(bits=4, group_size=128)
    expected = x.float().T @ x.float()
    with engine._half_input_hessians(True):
        got = gptq.GPTQ.compute_hessian_xtx(task, x)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_gptq_uses_the_eager_block_update_only_while_the_cuda_one_builds(monkeypatch):
    monkeypatch.delenv(BLOCK_UPDATE_OFF, raising=False)
    finish = threading.Event()
    build = threading.Thread(target=finish.wait)
    build.start()
    with eager_block_update_while(build):
        assert os.environ.get(BLOCK_UPDATE_OFF) == "1"  # GPTQ must not wait on the build
        finish.set()
        build.join()
        deadline = time.monotonic() + 120  # a bound for a loaded machine: the loop ends as soon as it holds
        while BLOCK_UPDATE_OFF in os.environ and time.monotonic() < deadline:
            time.sleep(0.05)
        assert BLOCK_UPDATE_OFF not in os.environ  # built: the CUDA block update from here on
    assert BLOCK_UPDATE_OFF not in os.environ


def test_the_block_update_switch_leaves_a_users_setting_and_a_finished_build_alone(monkeypatch):
    monkeypatch.delenv(BLOCK_UPDATE_OFF, raising=False)
    finished = threading.Thread(target=lambda: None)
    finished.start()
    finished.join()
    for build in (None, finished):
        with eager_block_update_while(build):
            assert BLOCK_UPDATE_OFF not in os.environ
    monkeypatch.setenv(BLOCK_UPDATE_OFF, "0")
    running = threading.Event()
    build = threading.Thread(target=running.wait)
    build.start()
    try:
        with eager_block_update_while(build):
            assert os.environ[BLOCK_UPDATE_OFF] == "0"
    finally:
        running.set()
        build.join()
    assert os.environ[BLOCK_UPDATE_OFF] == "0"
