"""The one seam to GPTQModel: the SALA definition, its QuantizeConfig, and one call, `run_gptq`.

Nothing else in soarpack imports gptqmodel (tests/test_quant_layers.py checks it), and nothing else knows how it
works: the transformers view it needs of our SALA model (`_wrap`) and where it leaves the packed tensors
(`GptqResult.packed`) are here too. GPTQModel is pinned to
`SUPPORTED_VERSION`; the few private touchpoints that remain are listed in `_PRIVATE` and checked by
`ensure_supported()` before any work, so an upgrade fails loudly here instead of silently somewhere else.

The definition reads like GPTQModel's own `module_tree`s and is derived from the module catalogue in
soarpack.sala.config: both layer kinds in one tree (`layer_modules_strict = False`: a sparse layer has `o_gate`, a
Lightning layer `z_proj` and its norms; either gate may be off). Norms are forward-only (`:!`). Quantization order
follows the data flow inside a layer: q/k/v (+ the gate, which reads the same normed input) → o_proj → gate/up →
down. With shared-input Hessians, modules that read the same tensor are tagged (`:in=`) so GPTQModel accumulates
one Hessian per input instead of one per module (test_quant_e2e checks the packed result is bit-identical).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence

import torch

from soarpack.errors import SoarpackError
from soarpack.facts import engine as engine_facts
from soarpack.sala.config import (ATTN_INPUT_LINEARS, ATTN_OUTPUT_LINEAR, LIGHTNING_GATE, MLP_INPUT_LINEARS,
                                  MLP_OUTPUT_LINEAR, MODEL_TYPE, SPARSE_GATE)

SUPPORTED_VERSION = engine_facts.GPTQMODEL
EngineMode = Literal["soarpack", "gptqmodel-defaults"]
LayerCallback = Callable[[int, int], None]  # (layer index, number of layers), at a layer's first forward

# Private GPTQModel names this module relies on, as (module, attribute). Each is used in exactly one place below.
_PRIVATE = (
    ("gptqmodel.models._const", "normalize_device"),  # QuantizeConfig keeps "cuda:1" as a str; the looper wants DEVICE
    ("gptqmodel.looper.loop_processor", "_PROJECT_LOG_DIR"),  # per-module logs go to ./logs unless redirected
    ("gptqmodel.quantization.gptq_cuda", "_EXTENSION"),  # why the block-update JIT failed (last_error_message)
    ("gptqmodel.quantization.gptq", "GPTQ.compute_hessian_xtx"),  # XᵀX of one batch: see _half_input_hessians
)
BLOCK_UPDATE_OFF = "GPTQMODEL_DISABLE_GPTQ_CUDA"  # GPTQModel's public switch for its CUDA block update
FP32_HESSIAN = "SOARPACK_FP32_HESSIAN"  # 1: keep GPTQModel's float32 XᵀX (to compare outputs with older soarpack)


class EngineError(SoarpackError):
    """GPTQModel is missing, of another version, or its internals differ from the supported version."""


@dataclass(frozen=True)
class EngineOptions:
    device: str  # "cpu", "cuda" or "cuda:N" (resolved, not "auto")
    batch_size: int
    mode: EngineMode = "soarpack"
    shared_input_hessians: bool = True
    offload_to_disk: bool = False
    log_dir: Optional[Path] = None  # GPTQModel's per-module logs; a temp folder, removed afterwards, when None


@dataclass
class GptqResult:
    packed: Dict[str, Dict[str, torch.Tensor]]  # module name -> its GPTQ tensors (qweight, qzeros, scales, g_idx)
    module_losses: List[Dict[str, Any]]  # per module: layer, module, loss, samples
    region_seconds: Dict[str, float]  # GPTQModel's region timer, totals over its worker threads
    region_counts: Dict[str, int] = field(default_factory=dict)


def quantizer() -> List[str]:
    """Who wrote a checkpoint, for its quantization_config's meta.quantizer: soarpack and the installed GPTQModel."""
    from importlib.metadata import PackageNotFoundError, version

    from soarpack.version import __version__

    try:
        engine = f"gptqmodel:{version('gptqmodel')}"
    except PackageNotFoundError:
        engine = "gptqmodel:unknown"
    return [f"soarpack:{__version__}", engine]


def module_tree(shared_input: bool = True) -> list:
    """GPTQModel's module_tree for SALA, from the catalogue."""
    attn_in = ":in=attn_in" if shared_input else ""
    mlp_in = ":in=mlp_in" if shared_input else ""
    attn_first = [f"{name.split('.')[-1]}:0{attn_in}" for name in ATTN_INPUT_LINEARS + (SPARSE_GATE, LIGHTNING_GATE)]
    mlp_first = [f"{name.split('.')[-1]}:0{mlp_in}" for name in MLP_INPUT_LINEARS]
    return [
        "model",
        "layers",
        "#",
        {
            "input_layernorm": ("input_layernorm:!",),
            "self_attn": ("q_norm:!", "k_norm:!", "o_norm:!", *attn_first, f"{ATTN_OUTPUT_LINEAR.split('.')[-1]}:1"),
            "post_attention_layernorm": ("post_attention_layernorm:!",),
            "mlp": (*mlp_first, f"{MLP_OUTPUT_LINEAR.split('.')[-1]}:1"),
        },
    ]


def ensure_supported() -> None:
    """Import GPTQModel (a banner on stdout, seconds) and refuse a version or internals we do not support."""
    import importlib

    # GPTQModel's own switch for its import-time "Python GIL is enabled" warning: multi-GPU MoE quantization and
    # free-threaded packing concern no run of ours (one dense model, the platform's CPython 3.10).
    os.environ.setdefault("GPTQMODEL_DISABLE_GIL_WARNING", "1")
    with _quiet_stdout(), _cpu_workers():
        try:
            import gptqmodel
        except ImportError as exc:
            raise EngineError(f"gptqmodel cannot be imported ({exc})",
                              f"install gptqmodel=={SUPPORTED_VERSION}") from None
    if gptqmodel.__version__ != SUPPORTED_VERSION:
        raise EngineError(f"gptqmodel {gptqmodel.__version__} is installed; soarpack supports {SUPPORTED_VERSION} only",
                          f"install gptqmodel=={SUPPORTED_VERSION}")
    for module, attr in _PRIVATE:
        owner = importlib.import_module(module)
        for part in attr.split("."):
            owner = getattr(owner, part, None)
        if owner is None:
            raise EngineError(f"gptqmodel has no {module}.{attr}: its internals differ from {SUPPORTED_VERSION}",
                              f"install gptqmodel=={SUPPORTED_VERSION}")


def build_block_update() -> Optional[str]:
    """Build (or load from GPTQModel's cache) the CUDA block-update extension GPTQ's first layer would otherwise
    JIT-compile, so it can happen in the background while weights load. None when it is ready or switched off;
    otherwise one line saying why not (GPTQModel then uses its torch block update: slower, same math)."""
    ensure_supported()
    if os.environ.get(BLOCK_UPDATE_OFF, "").lower() in ("1", "true", "yes", "on"):
        return None
    from gptqmodel.quantization import gptq_cuda

    if gptq_cuda.block_update_available():
        return None
    reason = gptq_cuda._EXTENSION.last_error_message() or "unknown reason"  # private: see _PRIVATE
    return f"GPTQModel's CUDA block update did not build ({reason.split(' | ')[0]}); GPTQ uses its torch fallback"


@contextlib.contextmanager
def eager_block_update_while(build: Optional[threading.Thread]) -> Iterator[None]:
    """While `build` (the background build of GPTQModel's CUDA block update) runs, GPTQ uses GPTQModel's eager torch
    block update instead of waiting for it; from the moment the build ends, the CUDA one.

    On a cold cache the build takes ~30 s of nvcc and ends after GPTQ's first layer is ready to solve, so waiting
    would stall the whole phase. The kernel keeps the eager loop's column order, round-to-nearest-even and separate
    multiply/subtract (compiled with --fmad=false), so which of the two solved a module changes no bit (the GPU
    check: benchmarks/RESULTS.md §2). A user's own GPTQMODEL_DISABLE_GPTQ_CUDA is left alone."""
    if build is None or not build.is_alive() or BLOCK_UPDATE_OFF in os.environ:
        yield
        return
    os.environ[BLOCK_UPDATE_OFF] = "1"  # GPTQModel reads it for every module it quantizes
    done = threading.Event()

    def switch_back() -> None:
        while build.is_alive() and not done.is_set():
            build.join(timeout=0.2)
        os.environ.pop(BLOCK_UPDATE_OFF, None)

    watcher = threading.Thread(target=switch_back, name="soarpack-block-update-switch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        os.environ.pop(BLOCK_UPDATE_OFF, None)


def run_gptq(sala: torch.nn.Module, model_dir: Path, rows: Sequence[Sequence[int]], recipe: Any,
             opts: EngineOptions, on_layer: Optional[LayerCallback] = None) -> GptqResult:
    """Quantize `sala` (a SalaForCausalLM on the CPU, loaded from `model_dir`) in place on `rows` of token ids with
    `recipe`'s grid.

    GPTQModel's logs go to stderr, never stdout; every process-wide setting touched is restored on return."""
    ensure_supported()
    defaults = opts.mode == "gptqmodel-defaults"
    hf = _wrap(sala)
    qcfg = _quantize_config(recipe, sala.config, opts.device, defaults, opts.offload_to_disk)
    definition = _definition(shared_input=opts.shared_input_hessians and not defaults)
    examples = [{"input_ids": torch.tensor([list(ids)]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
                for ids in rows]
    with _quiet_stdout(), _cpu_workers(), _log_dir(opts.log_dir), _layer_hooks(sala, on_layer), \
            _half_input_hessians(not defaults):
        gm = definition(hf, quantized=False, quantize_config=qcfg, tokenizer=None,
                        model_local_path=str(model_dir))
        if defaults:  # GPTQModel's own defaults: batch 1, its default calibration order
            log = gm.quantize(examples, batch_size=1)
        else:  # sorted by length so padding is small; GPTQModel masks padding out of the Hessian
            log = gm.quantize(examples, batch_size=opts.batch_size, calibration_sort="desc")
    stats = gm.quant_region_timer.snapshot()
    return GptqResult(
        packed=_packed_modules(sala),
        module_losses=_module_losses(log),
        region_seconds={k: round(v["total"], 3) for k, v in stats.items() if v["count"]},
        region_counts={k: v["count"] for k, v in stats.items() if v["count"]},
    )


# -- GPTQModel wiring ------------------------------------------------------------------------------------------


def _wrap(sala: torch.nn.Module) -> torch.nn.Module:
    """A transformers view of a loaded SalaForCausalLM that shares its modules, for GPTQModel.

    GPTQModel drives any `PreTrainedModel` whose decoder layers it can find through a declarative `module_tree`.
    The release's remote code cannot run on CPU (SALA.md §3), so GPTQModel gets our plain-PyTorch SALA instead,
    behind the small transformers surface it touches (`config`, `forward(input_ids, attention_mask)`,
    input/output embeddings): the very modules, the same HF names, nothing copied."""
    config_class, model_class = _hf_classes()
    raw = {k: v for k, v in sala.config.raw.items() if k not in ("auto_map", "architectures")}
    return model_class(config_class(**raw), sala).eval()


@functools.lru_cache(maxsize=None)
def _hf_classes() -> tuple:
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutput

    class SalaHFConfig(PretrainedConfig):
        model_type = MODEL_TYPE

        def __init__(self, **kwargs: object):
            # Every key of the original config.json becomes an attribute; nothing derived is added.
            super().__init__(**kwargs)

    class SalaHFForCausalLM(PreTrainedModel):
        config_class = SalaHFConfig
        base_model_prefix = "model"
        _no_split_modules = ["SalaDecoderLayer"]
        supports_gradient_checkpointing = False

        def __init__(self, config: SalaHFConfig, sala: torch.nn.Module):
            super().__init__(config)
            self.model = sala.model
            self.lm_head = sala.lm_head
            # Kept outside the module tree so its parameters are not registered twice.
            object.__setattr__(self, "_sala", sala)

        def get_input_embeddings(self):
            return self.model.embed_tokens

        def get_output_embeddings(self):
            return self.lm_head

        def _init_weights(self, module):  # weights always come from a checkpoint
            pass

        def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                    **ignored) -> CausalLMOutput:
            return CausalLMOutput(logits=self._sala(input_ids, attention_mask=attention_mask))

    return SalaHFConfig, SalaHFForCausalLM


def _packed_modules(model: torch.nn.Module) -> Dict[str, Dict[str, torch.Tensor]]:
    """Module name -> packed GPTQ tensors, for every module GPTQModel replaced with a quantized linear."""
    from soarpack.quant.gptq_format import QUANT_PARTS

    found = {}
    for name, module in model.named_modules():
        if all(hasattr(module, k) for k in QUANT_PARTS) and isinstance(getattr(module, "qweight", None), torch.Tensor):
            found[name] = {k: getattr(module, k) for k in QUANT_PARTS}
    return found


def _definition(shared_input: bool) -> type:
    from gptqmodel.models import BaseQModel

    class SalaGPTQ(BaseQModel):
        layer_modules_strict = False  # sparse layers have o_gate, Lightning layers z_proj and q/k/o norms
        pre_lm_head_norm_module = "model.norm"
        require_trust_remote_code = False
        shared_input_verified_model_types = frozenset({MODEL_TYPE}) if shared_input else frozenset()

    SalaGPTQ.module_tree = module_tree(shared_input)
    SalaGPTQ.__name__ = SalaGPTQ.__qualname__ = "SalaGPTQ" if shared_input else "SalaGPTQPlain"
    return SalaGPTQ


def _quantize_config(recipe: Any, config: Any, device: str, defaults: bool, offload_to_disk: bool) -> Any:
    from gptqmodel import QuantizeConfig
    from gptqmodel.models._const import normalize_device  # private: see _PRIVATE

    dynamic = recipe.render_dynamic(config) or None
    if defaults:  # GPTQModel's defaults, but for offload_to_disk: our finalize reads the packed tensors from memory
        qcfg = QuantizeConfig(bits=recipe.bits, group_size=recipe.group_size, sym=recipe.sym,
                              desc_act=recipe.desc_act, dynamic=dynamic, offload_to_disk=offload_to_disk)
    else:
        qcfg = QuantizeConfig(bits=recipe.bits, group_size=recipe.group_size, sym=recipe.sym,
                              desc_act=recipe.desc_act, damp_percent=recipe.damp, true_sequential=True,
                              dynamic=dynamic, offload_to_disk=offload_to_disk, device=device,
                              # packing dominates on GPU (SALA.md §6): pack there when we have one
                              pack_impl="gpu" if device.startswith("cuda") else "cpu",
                              fallback=None)  # never let a module fall back to round-to-nearest
    qcfg.device = normalize_device(device)
    return qcfg


def _module_losses(gptq_log: Any) -> List[Dict[str, Any]]:
    rows = []
    for entry in (gptq_log or {}).get("gptq", []) if isinstance(gptq_log, dict) else []:
        try:
            rows.append({"layer": int(entry["layer"]), "module": entry["module"], "loss": float(entry["loss"]),
                         "samples": int(entry.get("samples", 0))})
        except (KeyError, TypeError, ValueError):
            continue
    return rows


# -- process-wide settings, each restored on exit ----------------------------------------------------------------


@contextlib.contextmanager
def _half_input_hessians(enabled: bool) -> Iterator[None]:
    """Form each batch's XᵀX from the bf16/fp16 activations in one GEMM that accumulates in float32, on CUDA.

    GPTQModel upcasts the activations to float32 and runs an IEEE SGEMM (its loop switches TF32 off). On an H200
    that was most of the GPTQ phase: down_proj's Hessian alone is 2·N·16384² FLOP, 172 TFLOP a layer for 320k
    calibration tokens, at 54 TFLOP/s. A product of two bf16 (or fp16) numbers is exact in float32 and both GEMMs
    accumulate in float32; the tensor-core GEMM runs at 731 TFLOP/s and is 2.7e-5 from a float64 XᵀX where the
    SGEMM is 5.3e-6 (benchmarks/gpu_hessian.py), far inside GPTQ's damping (5 % of the mean diagonal). It is a
    numerical change all the same: GPTQ's error feedback turns such differences into other 4-bit codes (with the
    exact torch GLA, 13 % of them moved, from layer 0 on, at an unchanged KL: benchmarks/RESULTS.md §2).
    GPTQModel's own path stays for SOARPACK_FP32_HESSIAN=1, a CPU, float32 inputs and a torch without
    `mm(out_dtype=)`."""
    if not enabled or os.environ.get(FP32_HESSIAN, "").lower() in ("1", "true", "yes", "on"):
        yield
        return
    from gptqmodel.quantization.gptq import GPTQ  # private: see _PRIVATE

    original = GPTQ.compute_hessian_xtx
    supported = [True]

    def compute_hessian_xtx(self: Any, matrix: torch.Tensor) -> torch.Tensor:
        if supported[0] and matrix.is_cuda and matrix.dtype in (torch.bfloat16, torch.float16) and matrix.shape[0]:
            try:
                return torch.mm(matrix.T, matrix, out_dtype=torch.float32)
            except torch.cuda.OutOfMemoryError:
                raise
            except (TypeError, RuntimeError, NotImplementedError):  # no mm(out_dtype=) in this torch or build
                supported[0] = False
        return original(self, matrix)

    GPTQ.compute_hessian_xtx = compute_hessian_xtx
    try:
        yield
    finally:
        GPTQ.compute_hessian_xtx = original


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """GPTQModel logs to stdout; keep stdout for our result (`--json`)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


@contextlib.contextmanager
def _cpu_workers() -> Iterator[None]:
    """GPTQModel's default of one CPU worker crashes quantize() on machines of <= 3 cores; it reads this public
    variable when it first builds its thread pool."""
    name = "GPTQMODEL_CPU_WORKERS"
    if name in os.environ or (os.cpu_count() or 1) > 3:
        yield
        return
    os.environ[name] = "2"
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextlib.contextmanager
def _log_dir(folder: Optional[Path]) -> Iterator[None]:
    """Send GPTQModel's per-module logs to `folder`, or to a temp folder removed afterwards (soarpack's report holds
    the per-module losses), never to the user's ./logs or beside the output."""
    from gptqmodel.looper import loop_processor  # private: see _PRIVATE

    before = loop_processor._PROJECT_LOG_DIR
    with contextlib.ExitStack() as stack:
        root = folder or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soarpack-gptqmodel-logs-")))
        loop_processor._PROJECT_LOG_DIR = root / "gptqmodel-logs"
        try:
            yield
        finally:
            loop_processor._PROJECT_LOG_DIR = before


@contextlib.contextmanager
def _layer_hooks(sala: torch.nn.Module, on_layer: Optional[LayerCallback]) -> Iterator[None]:
    layers = list(sala.model.layers)
    started = [-1]

    def hook_for(i: int) -> Callable:
        def hook(module: torch.nn.Module, args: Any) -> None:
            if i > started[0]:
                started[0] = i
                on_layer(i, len(layers))
        return hook

    handles = [layer.register_forward_pre_hook(hook_for(i)) for i, layer in enumerate(layers)] if on_layer else []
    try:
        yield
    finally:
        for h in handles:
            h.remove()
