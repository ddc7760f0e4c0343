"""Child of `soarpack serve-check`: build MiniCPM-SALA through the SGLang fork's own code on a CPU and load weights.

Run only as a script in its own interpreter (`python -I _fork_child.py REQUEST.json`): it installs stand-in modules
and patches `torch.cuda`, which must never reach the caller. Standard library, torch and the fork only; nothing of
soarpack is imported, so the interpreter can be the image stand-in; the platform's facts it needs (the launch line,
the GPU the stand-ins answer as) come in the request, from soarpack.facts.

It writes one JSON object to the request's `result` path: {"ok": true, ...report} or {"ok": false, "error": "one
line"}; stdout and stderr are the fork's logs.
The parent compares the report with the recipe's plan.
"""

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import socket
import sys
import types

# GPU-only extensions the fork imports at module level, each replaced by an inert module. Nothing here runs a kernel.
STANDINS = {
    "sgl_kernel": "SGLang's CUDA kernels (Marlin GEMM, norms, rotary): a compiled CUDA extension",
    "flashinfer": "FlashInfer attention and sampling kernels: CUDA only",
    "fla": "flash-linear-attention: Triton kernels for the Lightning layers, compiled for a GPU at first call",
    "infllm_v2": "InfLLM-v2 block-sparse attention for the sparse layers: a CUDA extension",
    "sparse_kernel_extension": "MiniCPM's sparse-attention CUDA extension",
    "tilelang": "TileLang kernel compiler for the sparse backend: needs a GPU toolchain",
    "deep_gemm": "DeepSeek's FP8 GEMM: a CUDA extension",
    "vllm": "vLLM custom ops imported on a few CUDA/ROCm paths: not in the image",
    "flash_attn": "flash-attention: a CUDA extension, not in the image",
    "torchvision": "multimodal models' image ops: not in the image, and PyPI's wheel would pin another torch",
}
# Submodules of a stood-in package that are left missing on purpose: the fork catches the ImportError itself.
LEFT_MISSING = {
    # pure Python in sgl-kernel; missing, the fork's own get_scalar_types() fallback answers (uint4b8, uint8b128)
    "sgl_kernel.scalar_type",
}
STANDIN_VERSION = "0.0.0+soarpack.standin"
# What the platform's GPU answers, for the code that decides on Marlin: the request's "gpu" (soarpack.facts.gpu).
GPU = {}
INT_SENTINELS = (-0x5A5A5A5B, 0x3C3C3C3D)


class CheckFailure(Exception):
    """A one-line cause the parent prints as is."""


# -- stand-in modules -----------------------------------------------------------------------------------------


class _InertMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert_class(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())


class _InertBase(metaclass=_InertMeta):
    """Any use at import time works: subclassing, attribute access, calls, and use as a decorator (a no-op)."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _inert_class(f"{type(self).__qualname__}()")()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert_class(f"{type(self).__qualname__}.{name}")


def _inert_class(qualname):
    cls = _InertMeta(qualname.rsplit(".", 1)[-1], (_InertBase,), {})
    cls.__qualname__ = qualname
    return cls


class _StandinLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__version__ = STANDIN_VERSION
        module.__path__ = []  # a package, so any submodule import is answered by the finder too
        module.__soarpack_standin__ = True

        def __getattr__(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _inert_class(f"{spec.name}.{name}")

        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


class StandinFinder(importlib.abc.MetaPathFinder):
    """Answers imports of the STANDINS packages (and their submodules) with inert modules; nothing else."""

    def __init__(self):
        self.used = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".", 1)[0]
        if top not in STANDINS or fullname in LEFT_MISSING:
            return None
        self.used.add(top)
        return importlib.machinery.ModuleSpec(fullname, _StandinLoader(), is_package=True)


# -- torch.cuda as the platform's GPU would answer ------------------------------------------------------------


def _device_properties():
    major, minor = _capability()
    return types.SimpleNamespace(name=GPU["name"], major=major, minor=minor, total_memory=GPU["total_memory"],
                                 multi_processor_count=GPU["multi_processor_count"],
                                 L2_cache_size=GPU["L2_cache_size"], warp_size=GPU["warp_size"], gcnArchName="")


def _capability():
    return tuple(GPU["capability"])


def patch_torch_cuda(torch):
    torch.cuda.get_device_capability = lambda device=None: _capability()
    torch.cuda.get_device_properties = lambda device=None: _device_properties()
    torch.cuda.get_device_name = lambda device=None: GPU["name"]


def patch_triton_driver():
    """Triton's active driver, asked at import by some kernels for their target, answers a CUDA sm_120 target."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.runtime import driver
    except ImportError:
        return

    class StandinDriver:
        def get_current_target(self):
            major, minor = _capability()
            return GPUTarget("cuda", major * 10 + minor, GPU["warp_size"])

        def get_current_device(self):
            return 0

        def get_device_capability(self, device=0):
            return _capability()

        def __getattr__(self, name):
            raise AttributeError(f"triton driver stand-in has no {name}: a kernel was launched on a CPU check")

    driver.set_active(StandinDriver())


def patch_fork_after_import(sglang_srt):
    """The fork decides Marlin compatibility on CUDA only; answer as the platform's GPU would."""
    gptq = importlib.import_module("sglang.srt.layers.quantization.gptq")
    marlin_utils = importlib.import_module("sglang.srt.layers.quantization.marlin_utils")
    gptq._is_cuda = True
    marlin_utils.get_device_capability = lambda device_id=0: _capability()


# -- the checkpoint as served -----------------------------------------------------------------------------------

# For a tiny test checkpoint only, whose remote-code config is a placeholder that refuses to import: the real release
# ships a plain PretrainedConfig subclass here, and the fork replaces whatever it gives by MiniCPMHybridConfig.
STANDIN_REMOTE_CONFIG = (
    "from transformers import PretrainedConfig\n\n\n"
    "class {cls}(PretrainedConfig):\n"
    "    model_type = \"minicpm_sala\"\n"
)


def served_dir(ckpt, standin_remote_config, scratch):
    """The checkpoint itself, or (tiny models) a view of it whose placeholder config module imports."""
    if not standin_remote_config:
        return ckpt
    with open(os.path.join(ckpt, "config.json"), encoding="utf-8") as fh:
        module, _, cls = json.load(fh)["auto_map"]["AutoConfig"].partition(".")
    view = os.path.join(scratch, "served")
    os.makedirs(view)
    for entry in os.listdir(ckpt):
        if entry != f"{module}.py":
            os.symlink(os.path.join(os.path.abspath(ckpt), entry), os.path.join(view, entry))
    with open(os.path.join(view, f"{module}.py"), "w", encoding="utf-8") as fh:
        fh.write(STANDIN_REMOTE_CONFIG.format(cls=cls))
    return view


# -- the check ------------------------------------------------------------------------------------------------


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _module_name(rel_path):
    rel = rel_path[: -len(".py")]
    parts = rel.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_patched_modules(src, rel_paths):
    """Import every module our patches touch and check that each comes from `src`."""
    root = os.path.realpath(src)
    out = []
    for rel in rel_paths:
        name = _module_name(rel)
        module = importlib.import_module(name)
        where = os.path.realpath(getattr(module, "__file__", "") or "")
        if not where.startswith(root + os.sep):
            raise CheckFailure(f"{name} was imported from {where}, not from the given tree {root}")
        out.append({"module": name, "file": where})
    return out


def _fill_sentinel(params, int_sentinel):
    import torch

    for p in params.values():
        if p.is_floating_point():
            p.data.fill_(float("nan"))
        else:
            p.data.fill_(int_sentinel)


def _unwritten_masks(params, int_sentinel):
    import torch

    return {name: (torch.isnan(p.data) if p.is_floating_point() else p.data == int_sentinel) for name, p in params.items()}


def _load(model, weights):
    """Stream the checkpoint through the fork's load_weights, one tensor at a time, so every orphan is named."""
    orphans, loaded = [], 0
    for name, tensor in weights:
        try:
            model.load_weights([(name, tensor)])
            loaded += 1
        except KeyError as exc:  # load_weights' `params_dict[name]`: no parameter for this tensor
            orphans.append({"tensor": name, "param": str(exc.args[0]) if exc.args else ""})
    return loaded, orphans


def _linear_report(model):
    from sglang.srt.layers.linear import LinearBase

    out = []
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        method = getattr(module, "quant_method", None)
        qc = getattr(method, "quant_config", None)
        out.append({
            "module": name,
            "method": type(method).__name__ if method is not None else None,
            "bits": getattr(qc, "weight_bits", None),
            "group_size": getattr(qc, "group_size", None),
            "desc_act": getattr(qc, "desc_act", None),
            "sym": getattr(qc, "is_sym", None),
        })
    return out


def run(request):
    GPU.update(request["gpu"])
    src = os.path.realpath(request["sglang_src"])
    ckpt = served_dir(request["ckpt"], request.get("standin_remote_config", False), request["scratch"])
    sys.path.insert(0, src)
    finder = StandinFinder()
    sys.meta_path.insert(0, finder)
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"

    import torch

    patch_torch_cuda(torch)
    patch_triton_driver()
    import sglang.srt.utils as srt_utils

    if not os.path.realpath(srt_utils.__file__).startswith(src + os.sep):
        raise CheckFailure(f"sglang was imported from {srt_utils.__file__}, not from {src}")
    # RMSNorm and friends are the fork's own classes on the CPU engine with AMX; without it they come from vllm.
    srt_utils.cpu_has_amx_support = lambda: True
    srt_utils.common.cpu_has_amx_support = srt_utils.cpu_has_amx_support
    patch_fork_after_import(srt_utils)

    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.model_loader import loader as fork_loader
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_scheduler

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    initialize_model_parallel(1, 1)

    patched = import_patched_modules(src, request.get("patched_files", []))
    from sglang.srt.models.minicpm import MiniCPMSALAForCausalLM

    # The platform's launch line (the request's "launch"): our server args, then what the platform appends (theirs win).
    launch = request["launch"]
    server_args = prepare_server_args([launch["model_path_flag"], ckpt, *launch["before"],
                                       *request.get("server_args", []), *launch["after"]])
    set_global_server_args_for_scheduler(server_args)
    model_config = ModelConfig.from_server_args(server_args)
    hf_config = model_config.hf_config
    load_config = LoadConfig()
    packed = getattr(MiniCPMSALAForCausalLM, "packed_modules_mapping", {})
    quant_config = fork_loader._get_quantization_config(model_config, load_config, packed)
    with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
        model = MiniCPMSALAForCausalLM(config=hf_config, quant_config=quant_config)

    params = dict(model.named_parameters())
    loader = fork_loader.DefaultModelLoader(load_config)
    _fill_sentinel(params, INT_SENTINELS[0])
    loaded, orphans = _load(model, loader._get_all_weights(model_config, model))
    masks = _unwritten_masks(params, INT_SENTINELS[0])
    ints = [n for n, p in params.items() if not p.is_floating_point() and bool(masks[n].any())]
    if ints:  # an int parameter may hold the sentinel by chance: it is unwritten only if a second sentinel stays too
        _fill_sentinel({n: params[n] for n in ints}, INT_SENTINELS[1])
        _load(model, loader._get_all_weights(model_config, model))
        for n in ints:
            masks[n] = masks[n] & (params[n].data == INT_SENTINELS[1])
    unwritten = [{"param": n, "unwritten": int(m.sum()), "numel": int(m.numel())} for n, m in masks.items() if bool(m.any())]

    return {
        "ok": True,
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": importlib.import_module("transformers").__version__},
        "sglang_file": os.path.realpath(srt_utils.__file__),
        "config_class": type(hf_config).__name__,
        "sparse_layer_ids": list(getattr(hf_config, "sparse_layer_ids", []) or []),
        "quantization": model_config.quantization,
        "quant_config_class": type(quant_config).__name__ if quant_config is not None else None,
        "linears": _linear_report(model),
        "tensors_loaded": loaded,
        "orphans": orphans,
        "unwritten": unwritten,
        "params": len(params),
        "patched_modules": patched,
        "standins_used": sorted(finder.used),
    }


def _one_line(exc):
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:400]


def main(argv):
    with open(argv[1], encoding="utf-8") as fh:
        request = json.load(fh)
    try:
        result = run(request)
    except ModuleNotFoundError as exc:  # a module outside STANDINS is missing: name it
        result = {"ok": False, "missing_module": exc.name,
                  "error": f"module {exc.name!r} is missing from this interpreter (the fork's import chain needs it; "
                           f"only GPU-only extensions are stood in)"}
    except CheckFailure as exc:
        result = {"ok": False, "error": str(exc)}
    except Exception as exc:  # the fork's own code raised: the server would die the same way
        import traceback

        traceback.print_exc(file=sys.stderr)
        result = {"ok": False, "error": f"the fork raised {_one_line(exc)}"}
    with open(request["result"], "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
