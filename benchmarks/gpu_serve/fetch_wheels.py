"""Download exactly the cp312 wheels the shimmed fork server needs on the lent H200, into an excluded folder.

    python benchmarks/gpu_serve/fetch_wheels.py [--dest .whl] [--cache ~/.cache/soarpack/gpu-serve] [--list]

- SERVER_WHEELS: what the device lacks (KINDS.md's package list, DEVICE_PACKAGES below) or has at another version,
  pinned to the versions the image stand-in resolved for the fork (CPython 3.10 there, cp312 here). Downloaded with
  the device README's flags (`--no-deps --only-binary=:all: --python-version 3.12 ...`): one version of each.
- sglang-kernel 0.4.5 (383 MB) is downloaded into --cache and trimmed to its Python files plus
  `sgl_kernel/sm90/common_ops.abi3.so` (the study's §8 trim): `DEST/sglang-kernel-0.4.5-sm90.tar.gz`.
- The fork's python/ tree (d29fb130c) is copied from ../shared/data beside the checkout (../shared does not travel).
- The organisers' bench_serving.sh (../shared/data/soar-toolkit, byte for byte) as `organisers-bench_serving.sh`, and
  the fork's Marlin sources as `marlin-src-d29fb130c.tar.gz` (`git archive d29fb130c sgl-kernel/csrc/gemm/marlin
  sgl-kernel/include`) from a clone of tc-mb/sglang: --fork-git, by default the one `fetch github:tc-mb/sglang` leaves
  at ../.mirror/tc-mb+sglang/repo. ruler_lease.sh needs both; neither is ever committed.
- Prints each file's size and the total against the 64 MiB a call may carry (the tracked tree counts too).
"""

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CALL_LIMIT = 64 * 2**20
KERNEL = ("sglang-kernel", "0.4.5")
KERNEL_KEEP_SO = "sgl_kernel/sm90/common_ops.abi3.so"
FORK_ARCHIVE = "d29fb130c-python.tar.gz"
FORK_COMMIT = "d29fb130c"
MARLIN_ARCHIVE = f"marlin-src-{FORK_COMMIT}.tar.gz"
MARLIN_PATHS = ("sgl-kernel/csrc/gemm/marlin", "sgl-kernel/include")
ORGANISERS = ("soar-toolkit/bench_serving.sh", "organisers-bench_serving.sh")  # under shared/data, then its name here
PIP_FLAGS = ["--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
             "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
             "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
             "--platform", "manylinux1_x86_64", "--platform", "manylinux_2_24_x86_64",
             "--platform", "manylinux_2_31_x86_64", "--platform", "manylinux_2_34_x86_64"]

# (requirement, why). Versions: the image stand-in's (what pip resolved for the fork's pins), unless noted.
SERVER_WHEELS = [
    ("flashinfer-python==0.5.3", "the fork's pin: FlashInfer attention, rope (shim), sampling; JIT with the device's nvcc"),
    ("apache-tvm-ffi==0.1.9", "flashinfer 0.5.3's FFI (apache-tvm-ffi<0.2,>=0.1)"),
    ("fla-core==0.6.0", "fla.ops: the Lightning layers' simple_gla (Triton kernels), the only part of fla the fork uses"),
    ("transformers==4.57.1", "the fork's pin (the device has 5.17.0)"),
    ("tokenizers==0.22.2", "transformers 4.57.1 checks tokenizers<=0.23.0 at import (the device has 0.23.2)"),
    ("huggingface-hub==0.36.2", "transformers 4.57.1 checks huggingface-hub<1.0 at import (the device has 1.33.0)"),
    ("fastapi==0.162.5", "HTTP server"),
    ("opentelemetry-api==1.45.2", "fastapi 0.162.5 imports fastapi.telemetry (opentelemetry) at import; found on the device"), ("starlette==1.7.0", "fastapi"), ("uvicorn==0.54.0", "HTTP server"),
    ("python-multipart==0.0.32", "fastapi forms"), ("pydantic==2.14.4", "server protocol"),
    ("pydantic-core==2.50.5", "pydantic"), ("annotated-types==0.8.0", "pydantic"),
    ("typing-inspection==0.4.5", "pydantic"), ("orjson==3.13.0", "server JSON"), ("pyzmq==27.3.0", "IPC"),
    ("pybase64==1.5.1", "sglang.utils"), ("msgspec==0.23.0", "kv events"), ("setproctitle==1.3.8", "process names"),
    ("partial-json-parser==0.2.1.1.post7", "function-call parsers"), ("openai==2.6.1", "OpenAI protocol types"),
    ("distro==1.9.0", "openai"), ("jiter==0.18.0", "openai"), ("sniffio==1.3.1", "openai"),
    ("compressed-tensors==0.15.0.1", "quantization config registry"), ("loguru==0.7.3", "compressed-tensors"),
    ("gguf==0.19.0", "gguf quantization module, imported at module level"), ("dill==0.4.1", "custom logit processors"),
    ("jsonschema==4.26.0", "http_server's import chain"), ("referencing==0.37.0", "jsonschema"),
    ("rpds-py==0.30.0", "jsonschema"), ("jsonschema-specifications==2025.9.1", "jsonschema"),
]
# Loaded on the CPU rehearsal but deliberately not carried, with the reason.
NOT_CARRIED = {
    "torchao": "the shim stands it in: apply_torchao_config_to_model imports its names before returning on the empty "
               "--torchao-config, nothing else imports it; 0.9.0 is built for torch 2.9",
    "flash-linear-attention": "fla's layers/models (0.6.0 requires transformers>=5.6.2 and fla/__init__ imports "
                              "fla.models, which fails on the server's 4.57.1: found on the device); the fork only "
                              "imports fla.ops, which is fla-core",
    "exceptiongroup": "a backport for Python < 3.11; the device runs 3.12",
    "async-timeout": "aiohttp's backport for Python < 3.11",
    "setuptools": "on the device already (its package list)",
    "sglang-kernel": "carried as the trimmed tarball, not as a wheel",
    "xgrammar": "protocol.py imports it inside try/except; --grammar-backend none never compiles a grammar (8.5 MiB)",
    "ipython": "the shim stands in IPython (sglang/utils.py's IPython.display import; 7 MiB with its stack)",
}
# What the CPU rehearsal makes absent (installed in the image stand-in, not carried to the device).
REHEARSAL_ABSENT = ("xgrammar", "torchao", "IPython")
# KINDS.md, "Python packages already there" (read on a machine 2026-11-17); python3 is 3.12.3 with torch 2.11.0.
DEVICE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())


def dist_name(requirement):
    return requirement.split("==", 1)[0].lower().replace("_", "-")


def carried_names():
    return {dist_name(r) for r, _ in SERVER_WHEELS}


def uncovered(distributions):
    """Distributions a rehearsal loaded that neither the device has nor a carried wheel provides."""
    have = DEVICE_PACKAGES | carried_names() | set(NOT_CARRIED)
    return sorted(d for d in distributions if d not in have)


def ensure_excluded(dest):
    exclude = REPO / ".git" / "info" / "exclude"
    if not (REPO / ".git").is_dir():  # a worktree: .git is a file naming the real git dir
        gitdir = (REPO / ".git").read_text().split(":", 1)[1].strip()
        common = Path(gitdir).parent.parent
        exclude = common / "info" / "exclude"
    rel = "/" + os.path.relpath(dest, REPO).rstrip("/") + "/"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if rel not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as fh:
            fh.write(rel + "\n")


def pip_download(requirements, dest):
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", *PIP_FLAGS, "-d", str(dest),
           *requirements]
    subprocess.run(cmd, check=True)


def trim_kernel(wheel, out):
    """The wheel's Python files and the sm90 common_ops only, as a .tar.gz to unpack into the --target folder."""
    tmp = out.with_suffix(".part")
    with zipfile.ZipFile(wheel) as zf, tarfile.open(tmp, "w:gz") as tar:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            name = info.filename
            keep = name == KERNEL_KEEP_SO or (not name.endswith(".so") and not name.endswith("/"))
            if not keep:
                continue
            data = zf.read(info)
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o755 if name.endswith(".so") else 0o644, 0
            tar.addfile(ti, io.BytesIO(data))
    tmp.replace(out)
    return out


def shared_data(rel):
    """A file under shared/data beside the checkout (or above it), or None."""
    for base in (REPO, *REPO.parents):
        cand = base / "shared" / "data" / rel
        if cand.is_file():
            return cand
    return None


def fork_archive():
    return shared_data(f"sglang-fork/{FORK_ARCHIVE}")


def marlin_sources(fork_git, out, commit=FORK_COMMIT):
    """`git archive` of the fork's Marlin sources at commit, written atomically; an error text, or None."""
    if not (Path(fork_git) / "HEAD").exists() and not (Path(fork_git) / ".git").exists():
        return (f"no git clone of tc-mb/sglang at {fork_git}: `fetch github:tc-mb/sglang` gives one, or pass "
                f"--fork-git (without it ruler_lease.sh cannot build Marlin)")
    tmp = out.with_suffix(".part")
    proc = subprocess.run(["git", "-C", str(fork_git), "archive", "--format=tar.gz", "-o", str(tmp), commit,
                           *MARLIN_PATHS], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return f"git archive {commit} in {fork_git} failed: {proc.stderr.strip()}"
    tmp.replace(out)
    return None


def tracked_size():
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    return sum((REPO / p).stat().st_size for p in out.decode().split("\0") if p and (REPO / p).is_file())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=str(REPO / ".whl"))
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "soarpack" / "gpu-serve"))
    ap.add_argument("--list", action="store_true", help="print the wheel list and stop")
    ap.add_argument("--fork-git", default=str(REPO.parent / ".mirror" / "tc-mb+sglang" / "repo"),
                    help="a git clone of tc-mb/sglang holding %s (for the Marlin sources)" % FORK_COMMIT)
    a = ap.parse_args(argv)
    if a.list:
        for req, why in SERVER_WHEELS:
            print(f"{req:40s} {why}")
        return 0
    dest, cache = Path(a.dest).resolve(), Path(a.cache)
    dest.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    if str(dest).startswith(str(REPO) + os.sep):
        ensure_excluded(dest)
    pip_download([r for r, _ in SERVER_WHEELS], dest)
    kernel_wheel = next(cache.glob("sglang_kernel-0.4.5-*.whl"), None)
    if kernel_wheel is None:
        pip_download(["==".join(KERNEL)], cache)
        kernel_wheel = next(cache.glob("sglang_kernel-0.4.5-*.whl"))
    trim_kernel(kernel_wheel, dest / "sglang-kernel-0.4.5-sm90.tar.gz")
    fork = fork_archive()
    if fork is None:
        print(f"error: ../shared/data/sglang-fork/{FORK_ARCHIVE} not found beside the checkout", file=sys.stderr)
        return 2
    shutil.copy(fork, dest / FORK_ARCHIVE)
    organisers = shared_data(ORGANISERS[0])
    if organisers is None:
        print(f"error: ../shared/data/{ORGANISERS[0]} not found beside the checkout", file=sys.stderr)
        return 2
    shutil.copy(organisers, dest / ORGANISERS[1])
    why = marlin_sources(a.fork_git, dest / MARLIN_ARCHIVE)
    if why:
        print(f"warning: {why}", file=sys.stderr)
    names = {p.name.split("-")[0].lower().replace("_", "-") for p in dest.glob("*.whl")}
    dup = [n for n in names if len(list(dest.glob(n.replace("-", "_") + "-*.whl"))) > 1]
    files = sorted(p for p in dest.iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.stat().st_size / 2**20:8.2f} MiB  {p.name}")
    tree = tracked_size()
    print(f"{total / 2**20:8.2f} MiB  total in {dest} ({len(files)} files); tracked tree {tree / 2**20:.2f} MiB; "
          f"together {(total + tree) / 2**20:.2f} of {CALL_LIMIT / 2**20:.0f} MiB a call may carry")
    if dup:
        print(f"error: more than one version of {', '.join(sorted(dup))} in {dest}: remove the old ones", file=sys.stderr)
        return 2
    if total + tree > CALL_LIMIT:
        print("error: over the per-call limit: split the carry over two calls (README.md, plan)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
