"""Build the fork's own Marlin GEMM (sgl-kernel `csrc/gemm/marlin/`) as a torch extension, restricted to soarpack.

    python benchmarks/build_marlin_ext.py --src FORK/sgl-kernel --build DIR [--jobs 16]

FORK/sgl-kernel is the fork's `sgl-kernel/` directory (tc-mb/sglang at d29fb130c: `git archive d29fb130c
sgl-kernel/csrc/gemm/marlin sgl-kernel/include`); nothing of it is kept in this repository. The extension registers
the fork's op schemas `sgl_kernel::gptq_marlin_gemm` and `sgl_kernel::gptq_marlin_repack`
(`csrc/common_extension.cc`), so code written against sgl-kernel calls it unchanged
(`torch.ops.sgl_kernel.gptq_marlin_gemm`).

Restricted to what soarpack's checkpoints need: bf16 activations x {uint4b8, uint8b128} weights x group 128
(group_blocks 8), no act-order, no zero points. That is 15 kernel instantiations per weight type (the M-block /
tile variants of `get_marlin_kernel`'s COMMON table) instead of about 255 per dtype. Each instantiation gets a
translation unit of its own so ninja compiles them in parallel (MAX_JOBS); the dispatcher TU sees only the
declaration (`kernel.h`). Any other configuration (fp16, other group sizes, act order) is refused at run time by
the kernel's own "Unsupported shapes" check, never computed wrongly.

Prints the .so path and the build time; `--check` also runs a tiny GEMM against a dequantized matmul.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

MARLIN_FILES = ("marlin.cuh", "marlin_dtypes.cuh", "dequant.h", "kernel.h", "marlin_template.h",
                "gptq_marlin_repack.cu", "gptq_marlin.cu")
WEIGHT_TYPES = ("sglang::kU4B8", "sglang::kU8B128")
GROUP_BLOCKS = 8  # group 128 / 16
EXT_NAME = "soarpack_marlin"

# (thread_m_blocks, thread_n_blocks, thread_k_blocks, m_block_size_8, threads): COMMON_GET_IF's rows
# (gptq_marlin.cu) with the group fixed.
_M1 = [(1, n, k, m8, t) for (n, k, t) in ((8, 8, 256), (8, 4, 128), (4, 8, 128)) for m8 in (True, False)]
_M234 = [(m, n, k, False, t) for (n, k, t) in ((16, 4, 256), (8, 4, 128), (4, 8, 128)) for m in (2, 3, 4)]
CONFIGS = _M1 + _M234

REGISTRATION = r"""
#include <torch/all.h>
#include <torch/library.h>
#include "scalar_type.hpp"

torch::Tensor gptq_marlin_gemm(
    torch::Tensor& a, std::optional<torch::Tensor> c_or_none, torch::Tensor& b_q_weight, torch::Tensor& b_scales,
    std::optional<torch::Tensor> const& global_scale_or_none, std::optional<torch::Tensor> const& b_zeros_or_none,
    std::optional<torch::Tensor> const& g_idx_or_none, std::optional<torch::Tensor> const& perm_or_none,
    torch::Tensor& workspace, sglang::ScalarTypeId const& b_q_type_id, int64_t size_m, int64_t size_n,
    int64_t size_k, bool is_k_full, bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float);
torch::Tensor gptq_marlin_repack(torch::Tensor& b_q_weight, torch::Tensor& perm, int64_t size_k, int64_t size_n,
                                 int64_t num_bits);

// The schemas of the fork's csrc/common_extension.cc, verbatim.
TORCH_LIBRARY_FRAGMENT(sgl_kernel, m) {
  m.def(
      "gptq_marlin_gemm(Tensor! a, Tensor? c_or_none,"
      "Tensor! b_q_weight, Tensor! b_scales, Tensor? global_scale_or_none,"
      "Tensor? b_zeros_or_none, Tensor? g_idx_or_none, Tensor? perm_or_none,"
      "Tensor! workspace, int b_q_type_id, int size_m, int size_n, int size_k,"
      "bool is_k_full, bool use_atomic_add, bool use_fp32_reduce, bool is_zp_float) -> Tensor");
  m.impl("gptq_marlin_gemm", torch::kCUDA, &gptq_marlin_gemm);
  m.def("gptq_marlin_repack(Tensor! b_q_weight, Tensor! perm, int size_k, int size_n, int num_bits) -> Tensor");
  m.impl("gptq_marlin_repack", torch::kCUDA, &gptq_marlin_repack);
}
"""


def _get_if(wtype: str, cfg) -> str:
    m, n, k, m8, t = cfg
    return (f"  else if (q_type == {wtype} && thread_m_blocks == {m} && thread_n_blocks == {n} && thread_k_blocks == {k}"
            f" && m_block_size_8 == {str(m8).lower()} && group_blocks == {GROUP_BLOCKS} && num_threads == {t}"
            f" && is_zp_float == false) {{\n    kernel = Marlin<scalar_t, {wtype}.id(), {t}, {m}, {n}, {k},"
            f" {str(m8).lower()}, pipe_stages, {GROUP_BLOCKS}, false>;\n  }}\n")


def restricted_dispatcher(source: str) -> str:
    """gptq_marlin.cu with the kernel table cut to bf16 x {u4b8, u8b128} x group 128 and no template body."""
    if '#include "marlin_template.h"' not in source:
        raise SystemExit("gptq_marlin.cu: no #include \"marlin_template.h\" (not the fork's file?)")
    source = source.replace('#include "marlin_template.h"', "// marlin_template.h: compiled in the kernel TUs only")
    start = source.find("  COMMON_GET_IF(sglang::kU4)")
    end = source.find("  return kernel;", start)
    if start < 0 or end < 0:
        raise SystemExit("gptq_marlin.cu: get_marlin_kernel's table not found (not the fork's file at d29fb130c?)")
    table = "".join(_get_if(w, c) for w in WEIGHT_TYPES for c in CONFIGS)
    body = ("  if constexpr (std::is_same<scalar_t, nv_bfloat16>::value) {\n    if (false) {\n    }\n"
            + table + "  }\n\n")
    return source[:start] + body + source[end:]


def kernel_unit(wtype: str, cfg) -> str:
    m, n, k, m8, t = cfg
    return ('#include "kernel.h"\n#include "marlin_template.h"\n\nnamespace marlin {\n'
            f"template __global__ void Marlin<nv_bfloat16, {wtype}.id(), {t}, {m}, {n}, {k}, {str(m8).lower()},"
            f" pipe_stages, {GROUP_BLOCKS}, false>(MARLIN_KERNEL_PARAMS);\n}}\n")


def stage_sources(src: Path, build: Path) -> list:
    """Copy the fork's files into build/src, write the restricted dispatcher and one TU per kernel."""
    marlin = src / "csrc" / "gemm" / "marlin"
    include = src / "include"
    out = build / "src"
    out.mkdir(parents=True, exist_ok=True)
    for name in MARLIN_FILES:
        if not (marlin / name).is_file():
            raise SystemExit(f"error: {marlin / name} not found; pass --src the fork's sgl-kernel/ directory")
    shutil.copy2(include / "scalar_type.hpp", out / "scalar_type.hpp")
    for name in MARLIN_FILES[:-1]:
        shutil.copy2(marlin / name, out / name)
    sources = [out / "gptq_marlin_repack.cu"]
    (out / "gptq_marlin_restricted.cu").write_text(restricted_dispatcher((marlin / "gptq_marlin.cu").read_text()))
    sources.append(out / "gptq_marlin_restricted.cu")
    for w in WEIGHT_TYPES:
        for cfg in CONFIGS:
            tag = re.sub(r"\W", "", w.split("::")[1]) + "_" + "_".join(str(int(x)) for x in cfg)
            path = out / f"kernel_{tag}.cu"
            path.write_text(kernel_unit(w, cfg))
            sources.append(path)
    (out / "registration.cc").write_text(REGISTRATION)
    sources.append(out / "registration.cc")
    return sources


def build(src: Path, build_dir: Path, jobs: int, verbose: bool = False) -> Path:
    os.environ["MAX_JOBS"] = str(jobs)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")  # pip's ninja
    from torch.utils.cpp_extension import load

    sources = stage_sources(src, build_dir)
    inc = str(build_dir / "src")
    load(name=EXT_NAME, sources=[str(s) for s in sources], build_directory=str(build_dir), is_python_module=False,
         extra_include_paths=[inc], verbose=verbose,
         extra_cflags=["-O3", "-std=c++17", "-DNDEBUG"],
         extra_cuda_cflags=["-O3", "-DNDEBUG", "-std=c++17", "-gencode=arch=compute_90,code=sm_90",
                            "--expt-relaxed-constexpr", "--expt-extended-lambda", "-Xcompiler=-fPIC",
                            # nvcc >= 12.8 makes a __global__ template's host stub static per TU by default;
                            # the dispatcher launches kernels instantiated in other TUs.
                            "-static-global-template-stub=false",
                            # torch's extension builder disables the half/bf16 operators; sgl-kernel's CMake does not
                            "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                            "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"])
    return build_dir / f"{EXT_NAME}.so"


def load_built(so: Path) -> None:
    """Load a previously built .so (the op registrations happen on load)."""
    import torch

    torch.ops.load_library(str(so))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True, help="the fork's sgl-kernel/ directory")
    ap.add_argument("--build", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    so = build(args.src, args.build, args.jobs, args.verbose)
    print(f"built {so} ({so.stat().st_size / 2**20:.1f} MiB) in {time.time() - t0:.0f} s, "
          f"{len(WEIGHT_TYPES) * len(CONFIGS)} kernels")


if __name__ == "__main__":
    main()
