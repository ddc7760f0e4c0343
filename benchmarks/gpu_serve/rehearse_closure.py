"""CPU rehearsal of the shimmed fork's import closure (run it with the image stand-in's Python, CPython 3.10).

    python rehearse_closure.py --fork-src FORK/python --result OUT.json (--kernel-tree DIR | --kernel-names JSON)
    python rehearse_closure.py --record-names OUT.json --kernel-tree DIR   # the names table, from the real wheel

What it does, in a fresh interpreter (nothing of soarpack is imported but `_fork_child.py`'s CPU stand-ins):
- puts `shim/` first on sys.path and installs the shim, as `sitecustomize.py` does on the device;
- makes `sgl_kernel` the real sglang-kernel 0.4.5 Python tree (`--kernel-tree`, its `common_ops` .so, which only
  registers torch ops, replaced by an empty module), or a strict stand-in exposing exactly the names recorded
  from that tree (`--kernel-names`, sgl_kernel-0.4.5-names.json): a name the wheel lacks is an ImportError;
- answers torch.cuda as one H200 would (capability 9.0) so the fork takes its `if _is_cuda:` imports;
- stands in only the GPU packages this CPU cannot import (flashinfer, fla, ...): sparse_kernel_extension is left
  missing on purpose (dense mode must not import it) and tilelang/infllm_v2 come from the shim;
- imports the modules a dense server loads (launch_server's closure, the scheduler, ModelRunner, MiniCPM-SALA,
  the FlashInfer and hybrid linear-attention backends), then reads every loaded fork module's module-level
  `from sgl_kernel... import NAME` and says who provides each name.
"""

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.join(HERE, "shim")
FORK_CHILD = os.path.join(os.path.dirname(os.path.dirname(HERE)), "soarpack", "serve", "_fork_child.py")
# GPU-only packages the CPU stands in (on the device the real ones are carried or are not needed).
CPU_STANDINS = ("flashinfer", "fla", "deep_gemm", "vllm", "flash_attn", "torchvision")
# What `python -m sglang.launch_server --attention-backend flashinfer` loads for MiniCPM-SALA (the scheduler and
# ModelRunner run in spawned processes; the backends are created lazily by attention_registry).
DENSE_MODULES = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.cuda_graph_runner",
    "sglang.srt.models.minicpm",
    "sglang.srt.layers.attention.attention_registry",
    "sglang.srt.layers.attention.flashinfer_backend",
    "sglang.srt.layers.attention.hybrid_linear_attn_backend",
    "sglang.srt.layers.attention.fla.utils",
    "sglang.srt.layers.quantization.gptq",
    "sglang.srt.layers.quantization.marlin_utils",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.rotary_embedding",
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
)
KERNEL_VERSION = "0.4.5"
H200_CAPABILITY = (9, 0)
H200_MEMORY_MIB = 143771  # nvidia-smi on the lent H200 (device KINDS.md)


def _load_fork_child():
    spec = importlib.util.spec_from_file_location("soarpack_fork_child", FORK_CHILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The child's stand-ins answer as the GPU its request names (soarpack.facts.gpu for serve-check); this
    # rehearsal is for the lent H200, so they answer as one.
    module.GPU.update({"name": "NVIDIA H200", "capability": list(H200_CAPABILITY),
                       "total_memory": H200_MEMORY_MIB * 2**20, "multi_processor_count": 132,
                       "L2_cache_size": 50 * 2**20, "warp_size": 32})
    return module


class _KernelName:
    """A recorded name of the real package: raises when called; attributes answer likewise (scalar_types.uint4b8,
    which the fork reads at import, is an object there, not a function)."""

    def __init__(self, qualname):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname}: a kernel of sglang-kernel {KERNEL_VERSION} was called on a CPU rehearsal")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _KernelName(f"{self._qualname}.{name}")

    def __repr__(self):
        return f"<sglang-kernel {KERNEL_VERSION} stand-in {self._qualname}>"


# Left out of the strict stand-in: pure Python in the wheel whose objects the fork compares and measures
# (ScalarType), which a stand-in cannot imitate; missing, the fork's own get_scalar_types() falls back to its mock
# (as soarpack serve-check does). The real-tree rehearsal imports the real module.
STRICT_LEFT_OUT = ("sgl_kernel.scalar_type",)


class StrictKernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`sgl_kernel` and its submodules with exactly the recorded public names (each raises when called)."""

    def __init__(self, table):
        self.table = table  # {"sgl_kernel": [...], "sgl_kernel.elementwise": [...], ...}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.table and fullname not in STRICT_LEFT_OUT:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = KERNEL_VERSION
        for name in self.table[spec.name]:
            setattr(module, name, _KernelName(f"{spec.name}.{name}"))
        return module

    def exec_module(self, module):
        pass


class HidingPathFinder:
    """sys.meta_path's PathFinder, blind to packages this CPU has but the device will not: `import X` fails and
    importlib.util.find_spec(X) is None, as there (transformers probes optional packages that way)."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, path, target)

    def find_distributions(self, *args, **kwargs):
        hidden = {n.lower() for n in self.names}
        for dist in importlib.machinery.PathFinder.find_distributions(*args, **kwargs):
            if (dist.metadata["Name"] or "").lower() not in hidden:
                yield dist

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()


def hide_packages(names):
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
    sys.meta_path[:] = [HidingPathFinder(names) if f is importlib.machinery.PathFinder else f for f in sys.meta_path]


def patch_cuda_as_h200(torch, fork_child):
    fork_child.CAPABILITY = H200_CAPABILITY
    fork_child.DEVICE_NAME = "NVIDIA H200 (soarpack CPU rehearsal)"
    fork_child.patch_torch_cuda(torch)
    fork_child.patch_triton_driver()
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0


OPS_TABLE = os.path.join(HERE, "sgl_kernel-0.4.5-ops.json")
_libraries = []


def define_kernel_ops(path=OPS_TABLE):
    """What loading sm90/common_ops.abi3.so does to torch.ops.sgl_kernel: its schemas (no kernels on a CPU)."""
    import torch

    with open(path, encoding="utf-8") as fh:
        schemas = json.load(fh)["schemas"]
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for schema in schemas:
        lib.define(schema)
    _libraries.append(lib)
    return len(schemas)


def use_kernel_tree(tree):
    sys.path.insert(0, os.path.abspath(tree))
    common_ops = types.ModuleType("common_ops")  # the .so registers torch.ops.sgl_kernel.*; nothing runs here
    common_ops.__soarpack_cpu_standin__ = True
    common_ops.__file__ = "<soarpack CPU stand-in for sgl_kernel/sm90/common_ops.abi3.so>"
    sys.modules["common_ops"] = common_ops


def setup(args):
    fork_child = _load_fork_child()
    fork_child.STANDINS = {name: fork_child.STANDINS[name] for name in CPU_STANDINS}
    if getattr(args, "fork_src", None):
        sys.path.insert(0, os.path.realpath(args.fork_src))
    sys.path.insert(0, SHIM_DIR)
    sys.path.extend(os.path.abspath(p) for p in getattr(args, "extra_site", []))
    finder = fork_child.StandinFinder()
    sys.meta_path.insert(0, finder)
    hide_packages(getattr(args, "absent", []))
    if args.kernel_tree:
        use_kernel_tree(args.kernel_tree)
    else:
        with open(args.kernel_names, encoding="utf-8") as fh:
            sys.meta_path.insert(0, StrictKernelFinder(json.load(fh)["modules"]))
    import soarpack_gpu_shim

    if not getattr(args, "no_shim", False):
        soarpack_gpu_shim.install()  # first on sys.meta_path, as sitecustomize does it on the device
    import torch

    patch_cuda_as_h200(torch, fork_child)
    define_kernel_ops()
    return fork_child, finder, soarpack_gpu_shim


# -- what the fork's modules import, as it happens --------------------------------------------------------------


class ImportRecorder:
    """Wraps builtins.__import__: every `from sgl_kernel... import NAME` a fork module runs, and the first fork module
    that imports each other top-level package (the wheels the device must carry come from that list)."""

    def __init__(self):
        import builtins

        self.kernel = {}  # qualified name -> {fork modules}
        self.packages = {}  # top-level package -> first fork module importing it
        self._real = builtins.__import__
        builtins.__import__ = self

    def __call__(self, name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__", "") or ""
        if level == 0 and importer.split(".", 1)[0] == "sglang":
            top = name.split(".", 1)[0]
            if top == "sgl_kernel":
                for item in fromlist or ():
                    qualified = item if name == "sgl_kernel" else f"{name}.{item}"
                    self.kernel.setdefault(qualified, set()).add(importer)
            elif top != "sglang":
                self.packages.setdefault(top, importer)
        return self._real(name, globals, locals, fromlist, level)


def provider_of(qualified):
    kmod, _, name = qualified.rpartition(".") if "." in qualified else ("sgl_kernel", "", qualified)
    if f"{kmod}.{name}" in sys.modules:
        return f"sglang-kernel {KERNEL_VERSION} (module)"
    module = sys.modules.get(kmod)
    if module is None or not hasattr(module, name):
        return None
    mark = getattr(getattr(module, name), "__soarpack_provider__", None)
    return mark or f"sglang-kernel {KERNEL_VERSION}"


def third_party_packages(recorder, extra_sites=()):
    """{top-level package the fork imports: (its distribution folder, the first fork module importing it)}."""
    out = {}
    for name, importer in recorder.packages.items():
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) or ""
        if module is None or name in sys.builtin_module_names or not path:
            continue
        if "site-packages" in path:
            where = path.split("site-packages" + os.sep, 1)[1].split(os.sep, 1)[0]
        elif any(os.path.realpath(path).startswith(os.path.realpath(p) + os.sep) for p in extra_sites):
            where = os.path.relpath(path, next(p for p in extra_sites if os.path.realpath(path).startswith(os.path.realpath(p) + os.sep))).split(os.sep, 1)[0]
        else:
            continue  # the standard library
        out[name] = {"where": where, "importer": importer}
    return dict(sorted(out.items()))


def distributions_loaded():
    """The installed distributions whose top-level modules are loaded now (what must exist on the device too)."""
    import importlib.metadata as md

    owners = {}  # Python 3.10's packages_distributions reads top_level.txt only; read RECORD too
    for dist in md.distributions():
        for f in dist.files or ():
            top = f.parts[0] if f.parts else ""
            top = top[: -len(".py")] if top.endswith(".py") else top
            if top and not top.endswith((".dist-info", ".data")) and top != "..":
                owners.setdefault(top, set()).add(dist.metadata["Name"])
    out = set()
    for name, module in list(sys.modules.items()):
        if "." in name or not (getattr(module, "__file__", None) or ""):
            continue
        for dist in owners.get(name, ()):
            out.add(dist.lower().replace("_", "-"))
    return sorted(out)


def rehearse(args):
    fork_child, finder, shim = setup(args)
    recorder = ImportRecorder()
    imported, failed = [], {}
    for name in DENSE_MODULES:
        try:
            importlib.import_module(name)
            imported.append(name)
        except BaseException as exc:  # noqa: BLE001 - every failure is the finding
            failed[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
            traceback.print_exc()
    taken = recorder.kernel
    kernel = sys.modules.get("sgl_kernel")
    return {
        "ok": not failed,
        "python": sys.version.split()[0],
        "torch": importlib.import_module("torch").__version__,
        "kernel_source": "tree" if args.kernel_tree else "names",
        "strict_left_out": [] if args.kernel_tree else list(STRICT_LEFT_OUT),
        "imported": imported,
        "failed": failed,
        "kernel_names": {q: {"provider": provider_of(q), "modules": sorted(m)} for q, m in sorted(taken.items())},
        "shim_added": dict(getattr(kernel, "__soarpack_shim_added__", {}) or {}),
        "shim_standins": sorted(shim.standins_in_use),
        "cpu_standins_used": sorted(finder.used),
        "sparse_kernel_extension_imported": "sparse_kernel_extension" in sys.modules,
        "third_party": third_party_packages(recorder, args.extra_site),
        "distributions_loaded": distributions_loaded(),
    }


SERVER_ARG_FIELDS = ("model_path", "port", "host", "attention_backend", "quantization", "dtype", "kv_cache_dtype",
                     "force_dense_minicpm", "disable_radix_cache", "chunked_prefill_size", "cuda_graph_max_bs",
                     "grammar_backend", "skip_server_warmup", "tp_size", "max_running_requests", "trust_remote_code",
                     "disable_cuda_graph", "sampling_backend", "skip_tokenizer_init")


def parse_server_args(args):
    """The launcher's argv through the fork's own ServerArgs (prepare_server_args, __post_init__ included)."""
    fork_child, finder, shim = setup(args)
    with open(args.parse_args, encoding="utf-8") as fh:
        argv = json.load(fh)
    given = argv[argv.index("--model-path") + 1]
    if args.standin_remote_config:  # a tiny test checkpoint: its placeholder config module is swapped for one that imports
        i = argv.index("--model-path") + 1
        import tempfile

        scratch = tempfile.mkdtemp(prefix="served-view-", dir=os.path.dirname(os.path.abspath(args.result)))
        argv[i] = fork_child.served_dir(argv[i], True, scratch)
    import sglang.srt.utils.common as common

    common.get_nvgpu_memory_capacity = lambda: H200_MEMORY_MIB  # what nvidia-smi answers on the lent H200
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(argv)
    from sglang.srt.entrypoints import engine

    try:  # the launch's environment checks (engine.py), run before any process is spawned
        engine._set_envs_and_config(server_args)
        engine_env = "ok"
    except Exception as exc:  # noqa: BLE001 - reported
        engine_env = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
    try:  # the check that switch skips, alone: the distribution is sglang-kernel, not sgl-kernel
        common.assert_pkg_version("sgl-kernel", "0.3.20", "")
        kernel_check = "ok"
    except Exception as exc:  # noqa: BLE001 - reported
        kernel_check = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
    return {"ok": True, "argv": argv, "model_path_given": given, "engine_env": engine_env,
            "sgl_kernel_version_check": kernel_check, "fields": {f: getattr(server_args, f, None) for f in SERVER_ARG_FIELDS}}


def record_names(args):
    """{module: public names} of the real sglang-kernel tree, imported on this CPU with the shim off."""
    fork_child = _load_fork_child()
    use_kernel_tree(args.kernel_tree)
    import torch

    patch_cuda_as_h200(torch, fork_child)
    root = os.path.join(os.path.abspath(args.kernel_tree), "sgl_kernel")
    modules = {}
    for dirpath, _, files in os.walk(root):
        for fname in sorted(files):
            if not fname.endswith(".py") or "test" in fname:
                continue
            rel = os.path.relpath(os.path.join(dirpath, fname), os.path.dirname(root))[: -len(".py")]
            name = rel.replace(os.sep, ".").replace(".__init__", "")
            try:
                module = importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - recorded: a submodule that needs a .so the trim dropped
                modules[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            modules[name] = sorted(n for n in vars(module) if not n.startswith("_"))
    ok = {k: v for k, v in modules.items() if isinstance(v, list)}
    return {"source": f"sglang-kernel {KERNEL_VERSION} wheel (cp310-abi3), Python files, imported on a CPU",
            "modules": dict(sorted(ok.items())),
            "unimportable_on_cpu": {k: v["error"] for k, v in sorted(modules.items()) if k not in ok}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fork-src")
    parser.add_argument("--result")
    parser.add_argument("--kernel-tree")
    parser.add_argument("--kernel-names")
    parser.add_argument("--record-names")
    parser.add_argument("--absent", action="append", default=[],
                        help="a package this CPU has and the device will not (imports of it fail)")
    parser.add_argument("--no-shim", action="store_true", help="leave the shim out (what the fork needs without it)")
    parser.add_argument("--parse-args", help="a JSON list: the server argv to parse through the fork's ServerArgs")
    parser.add_argument("--standin-remote-config", action="store_true")
    parser.add_argument("--extra-site", action="append", default=[],
                        help="a folder of pure-Python packages the image stand-in lacks (appended to sys.path)")
    args = parser.parse_args(argv)
    if args.record_names:
        out, path = record_names(args), args.record_names
    elif args.parse_args:
        out, path = parse_server_args(args), args.result
    else:
        if not args.fork_src or not args.result or not (args.kernel_tree or args.kernel_names):
            parser.error("--fork-src, --result and one of --kernel-tree/--kernel-names are required")
        out, path = rehearse(args), args.result
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
