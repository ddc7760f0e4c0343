"""The layer-streamed forward (one layer's weights on the device at a time) gives the whole-model forward's logits,
and the sanity phase built on it gives the whole-model loss."""

import pytest
import torch

from soarpack.quant.options import quantize_options
from soarpack.quant.quality import next_token_logprobs, next_token_loss
from soarpack.quant.run import sanity_check
from soarpack.sala.checkpoint import load_model
from soarpack.sala.streaming import model_source, streamed_logits

ROWS = [list(range(5, 90)), list(range(100, 117)), [7] * 3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_streamed_logits_are_the_whole_model_logits(tiny_model_dir, dtype):
    model = load_model(tiny_model_dir, dtype=dtype)
    before = {n: p.clone() for n, p in model.named_parameters()}
    streamed = streamed_logits(model.config, model_source(model), ROWS, "cpu", dtype=dtype)
    assert len(streamed) == len(ROWS)
    with torch.no_grad():
        for ids, out in zip(ROWS, streamed):
            whole = model(torch.tensor([ids]))[0]
            assert out.shape == whole.shape and out.device.type == "cpu"
            torch.testing.assert_close(out, whole, rtol=0, atol=0)
    # the source model is left as it was: same tensors, still on the CPU
    for n, p in model.named_parameters():
        assert p.device.type == "cpu" and torch.equal(p, before[n]), n


def test_sanity_loss_is_the_whole_model_loss(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype=torch.bfloat16)
    whole = next_token_loss(next_token_logprobs(model, ROWS, "cpu"), ROWS)
    sanity = sanity_check(model, ROWS, "cpu", quantize_options(sanity_max_loss=None), _NoLog())
    assert sanity.loss == pytest.approx(whole, rel=1e-6)
    assert sanity.gla.backend == "torch" and sanity.gla.rel_diff is None  # nothing to compare on a CPU


def test_a_failing_layer_raises(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype=torch.float32)

    def source(prefix):
        tensors = model_source(model)(prefix)
        if prefix == "model.layers.1.":  # a corrupt layer: its q_proj has the wrong shape
            name = "model.layers.1.self_attn.q_proj.weight"
            tensors[name] = tensors[name][:, :-1]
        return tensors

    with pytest.raises(RuntimeError):
        streamed_logits(model.config, source, ROWS, "cpu", dtype=torch.float32)


class _NoLog:
    def info(self, *a):
        pass

    def note(self, *a):
        raise AssertionError(f"no fallback expected: {a}")
