"""Fill the gaps between sglang-kernel 0.4.5 (what loads on the device's torch 2.11) and the `sgl_kernel` names the
OpenBMB fork (built for sgl-kernel 0.3.20) imports at module level; stand in `tilelang` and `infllm_v2`.

Installed by `sitecustomize.py` beside this file, so every interpreter the server starts (the scheduler and
detokenizer are spawned processes) gets it when this folder is on PYTHONPATH. Standard library only until
`sgl_kernel` itself is imported. Every substitution is in PROVIDERS or STUBS and in README.md; nothing else is
touched. A stub raises when called, never at import: dense serving must not reach one, and if it does, the error
names the kernel.
"""

import dataclasses
import importlib.abc
import importlib.machinery
import os
import sys
import types

MARLIN_SO_ENV = "SOARPACK_MARLIN_SO"  # the device-built Marlin torch extension (issue 28), sgl_kernel:: schema
SHIM_MARK = "__soarpack_provider__"

# name -> who provides it here (added to `sgl_kernel` after the real package has imported)
PROVIDERS = {
    "gptq_marlin_gemm": "marlin-ext (torch.ops.sgl_kernel.gptq_marlin_gemm from $SOARPACK_MARLIN_SO)",
    "gptq_marlin_repack": "marlin-ext (torch.ops.sgl_kernel.gptq_marlin_repack from $SOARPACK_MARLIN_SO)",
    "apply_rope_with_cos_sin_cache_inplace": "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace for fp16/bf16; "
                                             "torch (the fork's forward_native math, in place) for fp32",
    "FusedSetKVBufferArg": "shim dataclass (sgl-kernel 0.3.20's fields; the fused KV write itself is refused)",
    "top_k_top_p_sampling_from_probs": "flashinfer.sampling.top_k_top_p_sampling_from_probs",
    "min_p_sampling_from_probs": "flashinfer.sampling.min_p_sampling_from_probs",
}
# names the fork imports on paths a dense GPTQ SALA server never takes (MoE, fp8, fp4, AWQ)
STUBS = {
    "awq_marlin_repack": "AWQ checkpoints",
    "awq_marlin_moe_repack": "AWQ MoE checkpoints",
    "moe_fused_gate": "MoE routing",
    "kimi_k2_moe_fused_gate": "Kimi-K2 MoE routing",
    "fp8_blockwise_scaled_mm": "fp8 block-quantized GEMM",
    "scaled_fp4_quant": "fp4 quantization",
    "cutlass_scaled_fp4_mm": "fp4 GEMM",
}
# torch operators the fork registers fake (meta) kernels for at import (`torch.library.register_fake` fails on an
# operator that does not exist) and sglang-kernel 0.4.5's common_ops lacks: defined here as schemas only, with no
# kernel, so a call raises torch's "no kernel" error. Schemas as sgl-kernel 0.3.20 declares them.
MISSING_OPS = {
    "moe_fused_gate": "moe_fused_gate(Tensor input_tensor, Tensor bias, int num_expert_group, int topk_group, "
                      "int topk, int num_fused_shared_experts, float routed_scaling_factor, "
                      "bool apply_routed_scaling_factor_on_output) -> Tensor[]",
}
# whole modules stood in when no real one is installed: imported by models/minicpm.py, called only in sparse mode
STANDIN_MODULES = {
    "tilelang": "TileLang JIT kernels of the sparse backend (minicpm_fuse_kernel.py, minicpm_sparse_utils.py)",
    "infllm_v2": "InfLLM-v2 sparse attention kernels (minicpm_sparse_utils.py)",
    # not a kernel: sglang/utils.py imports IPython.display (HTML, display) for notebooks at module level; the server
    # never displays anything, and IPython's stack is 7 MiB of the 64 a device call carries
    "IPython": "IPython.display for notebooks (sglang/utils.py)",
    # ModelRunner.initialize always calls apply_torchao_config_to_model, which imports torchao.quantization's names
    # before it returns on an empty --torchao-config (found on the device); torchao 0.9.0 is built for torch 2.9
    "torchao": "torchao.quantization for --torchao-config (layers/torchao_utils.py; empty here: nothing is called)",
}


class NotProvided(RuntimeError):
    """A kernel the shim stands in for was called: this run reached a path the dense variant should not take."""


def _stub(qualname, why):
    def stub(*args, **kwargs):
        raise NotProvided(f"{qualname} is a soarpack raise-if-called stand-in ({why}); the dense SALA server "
                          "should never call it: see benchmarks/gpu_serve/README.md")

    stub.__name__ = qualname.rsplit(".", 1)[-1]
    stub.__qualname__ = qualname
    setattr(stub, SHIM_MARK, f"stub ({why})")
    return stub


# -- sgl_kernel additions ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class FusedSetKVBufferArg:
    value: object
    k_buffer: object
    v_buffer: object
    k_scale: object
    v_scale: object
    cache_loc: object


_marlin_state = {"loaded": None}


def load_marlin(path=None):
    """Load the Marlin extension once; True when torch.ops.sgl_kernel.gptq_marlin_gemm exists afterwards."""
    import torch

    path = path or os.environ.get(MARLIN_SO_ENV)
    if path and _marlin_state["loaded"] != path:
        torch.ops.load_library(path)
        _marlin_state["loaded"] = path
    return hasattr(torch.ops.sgl_kernel, "gptq_marlin_gemm") and hasattr(torch.ops.sgl_kernel, "gptq_marlin_repack")


def _marlin_op(name):
    import torch

    if not load_marlin():
        raise NotProvided(f"sgl_kernel.{name}: torch.ops.sgl_kernel.{name} is not registered; set {MARLIN_SO_ENV} "
                          "to the Marlin extension built on the device (issue 28)")
    return getattr(torch.ops.sgl_kernel, name)


# Same signatures as sgl-kernel 0.3.20's Python wrappers (the fork calls them this way).
def gptq_marlin_gemm(a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm, workspace, b_q_type, size_m,
                     size_n, size_k, is_k_full=True, use_atomic_add=False, use_fp32_reduce=False, is_zp_float=False):
    return _marlin_op("gptq_marlin_gemm")(a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm, workspace,
                                          b_q_type.id, size_m, size_n, size_k, is_k_full, use_atomic_add,
                                          use_fp32_reduce, is_zp_float)


def gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits):
    return _marlin_op("gptq_marlin_repack")(b_q_weight, perm, size_k, size_n, num_bits)


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox=True,
                                          fused_set_kv_buffer_arg=None, enable_pdl=None):
    if fused_set_kv_buffer_arg is not None:
        raise NotProvided("apply_rope_with_cos_sin_cache_inplace(fused_set_kv_buffer_arg=...): flashinfer's rope has "
                          "no fused KV write; the fork passes one only for models that enable it, SALA does not")
    import torch

    if query.dtype == torch.float32:
        # SALA's attention casts q and k to fp32 before its rope (models/minicpm.py); sgl-kernel 0.3.20's kernel takes
        # fp32, flashinfer's dispatches fp16/bf16 only (found on the device, in CUDA-graph capture).
        _rope_torch_inplace(positions, query, head_size, cos_sin_cache, is_neox)
        _rope_torch_inplace(positions, key, head_size, cos_sin_cache, is_neox)
        return
    from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace as rope

    rope(positions=positions, query=query, key=key, head_size=head_size, cos_sin_cache=cos_sin_cache,
         is_neox=is_neox)


def _rope_torch_inplace(positions, x, head_size, cos_sin_cache, is_neox):
    """RotaryEmbedding.forward_native's math on x (tokens, heads * head_size), written back into x; graph-capturable."""
    import torch

    tokens = positions.numel()
    cos, sin = cos_sin_cache.index_select(0, positions.reshape(-1)).to(x.dtype).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    view = x.view(tokens, -1, head_size)
    rot = view[..., : cos_sin_cache.shape[-1]]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    rot.copy_(out)


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, *args, **kwargs):
    from flashinfer.sampling import top_k_top_p_sampling_from_probs as sample

    return sample(probs, top_k, top_p, *args, **kwargs)


def min_p_sampling_from_probs(probs, min_p, *args, **kwargs):
    from flashinfer.sampling import min_p_sampling_from_probs as sample

    return sample(probs, min_p, *args, **kwargs)


_op_library = []  # keeps the torch.library.Library alive (dropping it deregisters the schemas)


def define_missing_ops():
    import torch

    defined = []
    for name, schema in MISSING_OPS.items():
        if hasattr(torch.ops.sgl_kernel, name):
            continue
        if not _op_library:
            _op_library.append(torch.library.Library("sgl_kernel", "FRAGMENT"))
        _op_library[0].define(schema)
        defined.append(name)
    return defined


def augment_sgl_kernel(module):
    """Add what the fork needs and the real package lacks; a name the package has is never replaced."""
    added = {}
    here = sys.modules[__name__]
    for name, provider in PROVIDERS.items():
        if not hasattr(module, name):
            obj = getattr(here, name)
            try:
                setattr(obj, SHIM_MARK, provider)
            except (AttributeError, TypeError):
                pass
            setattr(module, name, obj)
            added[name] = provider
    for name, why in STUBS.items():
        if not hasattr(module, name):
            setattr(module, name, _stub(f"sgl_kernel.{name}", why))
            added[name] = f"stub ({why})"
    for name in define_missing_ops():
        added[f"torch.ops.sgl_kernel.{name}"] = "schema only (no kernel: a call raises)"
    module.__soarpack_shim_added__ = added
    if os.environ.get(MARLIN_SO_ENV):
        load_marlin()  # fail at import, loudly, rather than at the first W4 GEMM
    return module


# -- tilelang / infllm_v2 stand-ins ---------------------------------------------------------------------------


class _Names:
    """`tilelang.PassConfigKey.X`: a stable, hashable key per attribute."""

    def __init__(self, prefix):
        self._prefix = prefix

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{self._prefix}.{name}"


def _standin_module(fullname):
    why = STANDIN_MODULES[fullname.split(".", 1)[0]]
    module = types.ModuleType(fullname)
    module.__path__ = []
    module.__version__ = "0.0.0+soarpack.standin"
    setattr(module, SHIM_MARK, f"stand-in ({why})")

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{fullname}.{name}", why)

    module.__getattr__ = __getattr__
    if fullname == "tilelang":
        def jit(*args, **kwargs):  # @tilelang.jit and @tilelang.jit(...): the kernel becomes raise-if-called
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return _stub(f"tilelang.jit({args[0].__qualname__})", why)
            return lambda fn: _stub(f"tilelang.jit({fn.__qualname__})", why)

        module.jit = jit
        module.PassConfigKey = _Names("tilelang.PassConfigKey")
    return module


class _StandinLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _standin_module(spec.name)

    def exec_module(self, module):
        pass


class _AugmentingLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        augment_sgl_kernel(module)


class ShimFinder(importlib.abc.MetaPathFinder):
    def _others(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except ImportError:  # a finder that refuses the name (the CPU rehearsal's "absent on the device")
                return None
            if spec is not None:
                return spec
        return None

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".", 1)[0]
        if fullname == "sgl_kernel":
            spec = self._others(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _AugmentingLoader(spec.loader)
            return spec
        if top in STANDIN_MODULES:
            if top in standins_in_use or self._others(top, None, None) is None:
                standins_in_use.add(top)
                return importlib.machinery.ModuleSpec(fullname, _StandinLoader(), is_package=True)
        return None


standins_in_use = set()


def install():
    if not any(isinstance(f, ShimFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ShimFinder())
    if "sgl_kernel" in sys.modules and not hasattr(sys.modules["sgl_kernel"], "__soarpack_shim_added__"):
        augment_sgl_kernel(sys.modules["sgl_kernel"])


def describe():
    """What this shim stands in for, as rows for a README or a report."""
    rows = [("sgl_kernel." + n, p) for n, p in PROVIDERS.items()]
    rows += [("sgl_kernel." + n, f"stub ({w})") for n, w in STUBS.items()]
    rows += [(f"torch.ops.sgl_kernel.{n}", "schema only, no kernel") for n in MISSING_OPS]
    rows += [(m, f"stand-in module ({w})") for m, w in STANDIN_MODULES.items()]
    return rows
