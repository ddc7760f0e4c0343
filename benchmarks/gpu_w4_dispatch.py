"""W4/W8 GPTQ linears on a GPU by batch size M: bf16 vs the fork's Marlin vs dequantize + bf16 matmul, and the
M-dispatch of patch 04-w4-dispatch, with numerics at every M.

    python benchmarks/gpu_w4_dispatch.py --ext BUILD/soarpack_marlin.so --fork PATCHED/python --json out.json [--tune]
    python benchmarks/gpu_w4_dispatch.py --render out.json        # the markdown tables of RESULTS.md §5

--ext    the fork's Marlin built by benchmarks/build_marlin_ext.py (registers sgl_kernel::gptq_marlin_gemm/_repack)
--fork   a fork python/ tree with the soarpack patch set applied: the dispatch code is the block that patch
         04-w4-dispatch adds to its marlin_utils.py, run as that file has it (benchmarks/w4_dispatch_block.py);
         without --fork, the same block read from sglang/04-w4-dispatch.patch (soarpack.kernels.block)
--splitk-sweep  also time soarpack/kernels/w4_splitk.py under each of its SPLITK_CONFIGS (W4, M <= 16)

Marlin: the image's sgl_kernel when it imports, else --ext. Timing, tensors and the layout check are
soarpack.kernels.cuda's (what `soarpack kernels` runs); the thresholds are soarpack.kernels.thresholds'.
The split-K decode kernel (soarpack/kernels/w4_splitk.py, not routed by the patch) is timed in phase 1 at W4 and
M <= 16 ("splitk" columns, its own table in --render), with its error against the same fp32 reference.

Every SALA linear as the fork fuses it (sparse qkv 4608x4096; o, o_gate, Lightning z, o 4096x4096; Lightning qkv
12288x4096; gate_up 32768x4096; down 4096x16384), W4 (uint4b8) and W8 (uint8b128), group 128, symmetric, random
GPTQ v1 tensors as soarpack writes them (qzeros 0x77777777 / 0x7f7f7f7f, scales exact in fp16 and bf16).
Routes: bf16 (`F.linear` on the bf16 weight, what a bf16 server runs), Marlin (`gptq_marlin_gemm` after
`gptq_marlin_repack`, fp32 reduce, as the fork calls it), dequant (the patch's Triton dequantization from Marlin's
layout, then the same `F.linear`), dispatch (the patch's `soarpack_w4_gemm` with its built-in thresholds).
Times: µs per call, replayed from a CUDA graph that cycles through enough weight copies to exceed the L2
(METHOD.md); the routes of one (shape, M) are timed in turn for 3 rounds, median (clock and temperature drift fall
on all alike). Phase 1 times bf16, Marlin, dequant + matmul and the dequantization alone; phase 2, after every M of
the shape, times bf16, Marlin and the dispatch again: ratios of the dispatch are to phase 2's bf16 and Marlin, and
the roll-up uses phase 2 throughout. Numerics: ||out − ref|| / ||ref|| against the fp32 product of
`soarpack.quant.gptq_format.dequantize` (TF32 off). "read floor": the route's fewest bytes (quantized weight +
scales + x + out) over the read bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SHAPES = {  # class -> (size_n, size_k, the modules it stands for)
    "sparse_qkv": (4608, 4096, "sparse q+k+v"),
    "attn": (4096, 4096, "sparse o, o_gate; Lightning z, o"),
    "lightning_qkv": (12288, 4096, "Lightning q+k+v"),
    "gate_up": (32768, 4096, "gate+up"),
    "down": (4096, 16384, "down"),
}
M_TABLE = (1, 2, 4, 8, 16, 32, 64, 128, 512, 2048, 8192)
M_EXTRA = (256, 1024)  # between the table's points, to place the thresholds
ROUTES = ("bf16", "marlin", "dequant", "dispatch")
HAVE_MARLIN = True
L2_BYTES = 256 << 20  # cycle weight copies until the graph touches this much (the H200's L2 is 60 MB)



# The timing, the tensors and the Marlin layout are the library's (soarpack kernels measures the same way).
from soarpack.kernels.cuda import (Graph, device_ceilings, interleaved, load_marlin, make_layer, rel_err,  # noqa: E402,F401
                                   to_marlin as _to_marlin)
from soarpack.kernels.thresholds import choose_thresholds  # noqa: E402
from soarpack.kernels import w4_splitk  # noqa: E402

SPLITK_M = 16  # the split-K decode kernel (soarpack/kernels/w4_splitk.py) is timed at W4, M <= 16; not routed


def to_marlin(block, layer: dict, size_n: int, size_k: int, bits: int) -> tuple:
    return _to_marlin(block, layer, size_n, size_k, bits, HAVE_MARLIN)


def bench_shape(block, cls: str, bits: int, ms, ceilings: dict, gen) -> list:
    size_n, size_k, _ = SHAPES[cls]
    wtype_id = {4: 1125899907892224, 8: 1125899923621888}[bits]  # scalar_types.uint4b8.id / uint8b128.id
    layer = make_layer(size_n, size_k, bits, gen)
    qm, sm, layout_ok = to_marlin(block, layer, size_n, size_k, bits)
    w_bf16 = layer["w_ref"].to(torch.bfloat16)
    del layer["qweight"], layer["qzeros"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    workspace = torch.zeros(sms, dtype=torch.int32, device="cuda")
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    w_deq = block.soarpack_marlin_dequant(qm, sm, size_k, size_n, bits)
    deq_exact = bool(torch.equal(w_deq, w_bf16))  # scales exact, (q - bias) * s rounded once to bf16 in both
    deq_err_vs_torch = (w_deq.float() - block.soarpack_marlin_dequant_torch(qm, sm, size_k, size_n, bits).float()).abs().max().item()
    del w_deq
    q_bytes = qm.numel() * 4 + sm.numel() * 2
    copies = max(1, min(8, math.ceil(L2_BYTES / q_bytes)))
    qms = [qm] + [qm.clone() for _ in range(copies - 1)]
    sms_ = [sm] + [sm.clone() for _ in range(copies - 1)]
    bf_copies = max(1, min(8, math.ceil(L2_BYTES / (w_bf16.numel() * 2))))
    wbs = [w_bf16] + [w_bf16.clone() for _ in range(bf_copies - 1)]

    def call(route, x, c):
        if route == "bf16":
            return F.linear(x, wbs[c % bf_copies])
        if route.startswith("splitk"):  # "splitk" (default config) or "splitk BN,SPLIT,WARPS" (the --tune sweep)
            cfg = tuple(None if v == "-" else int(v) for v in route[7:].split(",")) if " " in route else None
            return w4_splitk.w4_splitk_gemm(x, qms[c], sms_[c], size_n, size_k, config=cfg)
        return block.soarpack_w4_gemm(x, qms[c], sms_[c], empty, empty, empty, workspace, wtype_id, bits, size_n,
                                      size_k, True, False, True, route=None if route == "dispatch" else route)

    def measure(m, x, ref, routes, extra=None) -> dict:
        row, graphs = {}, {}
        for route in routes:
            try:
                out = call(route, x, 0)
                row[f"{route}_err"] = rel_err(out, ref)
                del out
                n_calls = copies if route != "bf16" else bf_copies
                graphs[route] = Graph([(lambda c=c, r=route: call(r, x, c)) for c in range(n_calls)])
            except Exception as exc:  # a failing route is a finding; keep the other rows
                row[f"{route}_error"] = repr(exc)[:300]
        graphs.update(extra or {})
        times = interleaved(graphs)
        del graphs
        for route in list(routes) + list(extra or {}):
            row[f"{route}_us"] = times.get(route, float("nan")) * 1e6
        return row

    rows, inputs = [], {}
    for m in ms:  # phase 1: the three kernels
        x = torch.randn(m, size_k, generator=gen, device="cuda", dtype=torch.bfloat16)
        inputs[m] = x
        ref = x.float() @ layer["w_ref"].t()
        row = {"class": cls, "shape": f"{size_n}x{size_k}", "bits": bits, "M": m, "copies": copies,
               "marlin_layout_matches_reference": layout_ok, "dequant_equals_bf16_weight": deq_exact,
               "dequant_triton_vs_torch_maxabs": deq_err_vs_torch}
        io_bytes = (m * size_k + m * size_n) * 2
        row["read_floor_us"] = (q_bytes + io_bytes) / (ceilings["read_GBps"] * 1e9) * 1e6
        row["bf16_read_floor_us"] = (size_n * size_k * 2 + io_bytes) / (ceilings["read_GBps"] * 1e9) * 1e6
        row["mma_floor_us"] = 2 * m * size_n * size_k / (ceilings["bf16_TFLOPs"] * 1e12) * 1e6
        alone = {"dequant_alone": Graph([(lambda c=c: block.soarpack_marlin_dequant(qms[c], sms_[c], size_k, size_n, bits))
                                         for c in range(copies)])}
        splitk = bits == 4 and m <= SPLITK_M and w4_splitk.triton is not None
        routes = ("bf16", "marlin", "dequant") + (("splitk",) + (SPLITK_SWEEP if SWEEP else ()) if splitk else ())
        row.update(measure(m, x, ref, routes, alone))
        for route in ("marlin", "dequant") + (("splitk",) if splitk else ()):
            row[f"{route}_vs_bf16"] = row[f"{route}_us"] / row["bf16_us"]
            row[f"{route}_vs_floor"] = row[f"{route}_us"] / row["read_floor_us"]
        if splitk:
            row["splitk_vs_marlin"] = row["splitk_us"] / row["marlin_us"]
            row["splitk_config"] = list(w4_splitk.default_config(size_n, size_k))
        row["winner_w4"] = "marlin" if row["marlin_us"] <= row["dequant_us"] else "dequant"
        rows.append(row)
        del ref
    for row in rows:  # phase 2: the patch's dispatch, beside bf16 again
        m, x = row["M"], inputs[row["M"]]
        ref = x.float() @ layer["w_ref"].t()
        row["threshold"] = block.SOARPACK_W4_ACTIVE[(cls, bits)]
        row["dispatch_route"] = block.soarpack_w4_route(m, size_n, size_k, bits)
        again = measure(m, x, ref, ("bf16", "marlin", "dispatch"))
        row["dispatch_us"], row["dispatch_err"] = again["dispatch_us"], again.get("dispatch_err")
        row["bf16_again_us"], row["marlin_again_us"] = again["bf16_us"], again["marlin_us"]
        row["dispatch_vs_bf16"] = row["dispatch_us"] / row["bf16_again_us"]
        row["dispatch_vs_marlin"] = row["dispatch_us"] / row["marlin_again_us"]
        row["dispatch_vs_floor"] = row["dispatch_us"] / row["read_floor_us"]
        del ref
    del inputs
    del qms, sms_, wbs, w_bf16, layer
    torch.cuda.empty_cache()
    return rows


SPLITK_SWEEP = tuple("splitk " + ",".join("-" if v is None else str(v) for v in c) for c in w4_splitk.SPLITK_CONFIGS)
SWEEP = False  # --splitk-sweep: also time every SPLITK_CONFIGS entry

TILINGS = ((64, 128, 4), (32, 128, 4), (64, 64, 4), (128, 128, 8), (64, 128, 8), (128, 64, 4))


def tune(block, gen) -> dict:
    """W4 and W8: the dequantization alone under other Triton tilings (BN, BK, warps), timed interleaved. Reported only:
    the table runs the patch's own tiling."""
    out = {}
    for key in (f"{c}:{b}" for b in (4, 8) for c in SHAPES):
        cls, bits = key.split(":")[0], int(key.split(":")[1])
        size_n, size_k, _ = SHAPES[cls]
        layer = make_layer(size_n, size_k, bits, gen)
        qm, sm, _ = to_marlin(block, layer, size_n, size_k, bits)
        copies = max(1, min(8, math.ceil(L2_BYTES / (qm.numel() * 4))))
        qms, sms_ = [qm] + [qm.clone() for _ in range(copies - 1)], [sm] + [sm.clone() for _ in range(copies - 1)]
        del layer
        graphs = {t: Graph([(lambda c=c, t=t: block.soarpack_marlin_dequant(qms[c], sms_[c], size_k, size_n, bits, tiling=t))
                            for c in range(copies)]) for t in TILINGS}
        out[key] = {str(t): v * 1e6 for t, v in interleaved(graphs).items()}
        del graphs, qms, sms_
    torch.cuda.empty_cache()
    print("  tiling (us per dequant): " + "; ".join(f"{c}: " + ",".join(f"{t}:{v:.1f}" for t, v in d.items())
                                                     for c, d in out.items()), flush=True)
    return out


def suggest_thresholds(rows) -> dict:
    """Per (class, bits): soarpack.kernels.thresholds.choose_thresholds on phase 1's Marlin and dq+mm times
    (NEVER = 2**30 where Marlin won at the largest M)."""
    return {f"{c}:{b}": v for (c, b), v in sorted(choose_thresholds(rows).items())}


def render_splitk(res: dict) -> str:
    """The decode kernel's table: W4, M <= 16, µs and its ratios to the read floor, Marlin and bf16."""
    lines = ["| shape (class) | M | read floor | bf16 | Marlin | split-K | split-K/floor | split-K/Marlin | split-K/bf16 "
             "| Marlin/floor | err split-K | config (BN, split, warps, contiguous) | best of sweep |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in res["rows"]:
        if "splitk_us" not in r:
            continue
        sweep = {k[7:]: v for k, v in r.items() if k.startswith("splitk ") and k.endswith("_us")}
        best = min(sweep, key=sweep.get) if sweep else None
        best_txt = f"{best[:-3]}: {sweep[best]:.1f}" if best else "-"
        lines.append(f"| {r['shape']} ({r['class']}) | {r['M']} | {r['read_floor_us']:.1f} | {r['bf16_us']:.1f} | "
                     f"{r['marlin_us']:.1f} | {r['splitk_us']:.1f} | {r['splitk_vs_floor']:.2f} | {r['splitk_vs_marlin']:.2f} | "
                     f"{r['splitk_vs_bf16']:.2f} | {r['marlin_vs_floor']:.2f} | {r.get('splitk_err', float('nan')):.1e} | "
                     f"{tuple(r['splitk_config'])} | {best_txt} |")
    return "\n".join(lines)


def rollup(rows) -> list:
    """Decoder linears per step (M = 1, 8, 32, 8192) for bf16 and each built-in recipe, Marlin only and with the
    dispatch (phase 2's times), plus the best measured route per linear (split-K included) and the read floor:
    soarpack.kernels.measure.rollup on the recipes' own module counts."""
    from soarpack.kernels.measure import rollup as library_rollup
    from soarpack.kernels.workload import bf16_workload, recipe_workload
    from soarpack.recipe.model import list_recipes

    lib_rows = []
    for r in rows:
        n, k = (int(v) for v in r["shape"].split("x"))
        lib_rows.append(dict(r, size_n=n, size_k=k, bf16_us=r["bf16_again_us"], marlin_us=r["marlin_again_us"]))
    workloads = [bf16_workload()] + [recipe_workload(name) for name in list_recipes()]
    ms = sorted({r["M"] for r in rows})
    out = []
    for r in library_rollup(workloads, lib_rows, {}, ms):
        out.append({"M": r["M"], "recipe": r["workload"], "marlin_ms": r["marlin_ms"], "dispatch_ms": r["dispatch_ms"],
                    "marlin_vs_bf16": r["marlin_vs_bf16"], "dispatch_vs_bf16": r["dispatch_vs_bf16"],
                    "best_ms": r["best_ms"], "floor_ms": r["floor_ms"],
                    "best_vs_floor": r["best_ms"] / r["floor_ms"] if r["best_ms"] and r["floor_ms"] else None})
    return out


def print_tables(res: dict) -> None:
    if any("splitk_us" in r for r in res["rows"]):
        print(render_splitk(res))
    c = res["ceilings"]
    print(f"read {c['read_GBps']:.0f} GB/s, copy {c['copy_GBps']:.0f} GB/s (read+write), bf16 mm {c['bf16_TFLOPs']:.0f} TFLOP/s")
    print(f"{'class':14}{'b':>2}{'M':>6}{'floor':>8}{'bf16':>9}{'marlin':>9}{'dq+mm':>9}{'disp':>9}{'dq':>8}"
          f"{'mar/bf':>7}{'dq/bf':>7}{'dis/bf':>7}{'dis/m':>7}{'win':>8}{'route':>8}{'err m':>9}{'err dq':>9}{'err dis':>9}")
    for r in res["rows"]:
        print(f"{r['class']:14}{r['bits']:>2}{r['M']:>6}{r['read_floor_us']:>8.1f}{r['bf16_us']:>9.1f}{r['marlin_us']:>9.1f}"
              f"{r['dequant_us']:>9.1f}{r['dispatch_us']:>9.1f}{r['dequant_alone_us']:>8.1f}{r['marlin_vs_bf16']:>7.2f}"
              f"{r['dequant_vs_bf16']:>7.2f}{r['dispatch_vs_bf16']:>7.2f}{r['dispatch_vs_marlin']:>7.2f}{r['winner_w4']:>8}{r['dispatch_route']:>8}"
              f"{r.get('marlin_err') or float('nan'):>9.1e}{r.get('dequant_err') or float('nan'):>9.1e}{r.get('dispatch_err') or float('nan'):>9.1e}")
    print("layout/dequant checks:", {f"{r['class']}:{r['bits']}": (r["marlin_layout_matches_reference"], r["dequant_equals_bf16_weight"],
                                                                  r["dequant_triton_vs_torch_maxabs"]) for r in res["rows"] if r["M"] == 1})
    print("configuration:", res["configuration"], "thresholds used:", res["thresholds_used"])
    for r in res["rollup"]:
        print(f"rollup M={r['M']:>5} {r['recipe']:12} marlin {r['marlin_ms']:8.3f} ms ({r['marlin_vs_bf16']:.2f}x)"
              f"  dispatch {r['dispatch_ms']:8.3f} ms ({r['dispatch_vs_bf16']:.2f}x)")


def render_markdown(res: dict) -> str:
    """The RESULTS.md tables of a --json file."""
    c = res["ceilings"]
    lines = [f"Device: {res['device']}, torch {res['torch']}; read {c['read_GBps']:.0f} GB/s (torch.sum over 4 GiB), "
             f"copy {c['copy_GBps']:.0f} GB/s (read + write), bf16 GEMM {c['bf16_TFLOPs']:.0f} TFLOP/s (8192^3).", "",
             "| shape (class) | bits | M | read floor | bf16 | Marlin | dq+mm | dequant alone | Marlin/bf16 | dq+mm/bf16 "
             "| winner | dispatch route | dispatch | dispatch/bf16 | dispatch/Marlin | dispatch/floor | err Marlin | err dq+mm "
             "| err dispatch |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(
            f"| {r['shape']} ({r['class']}) | {r['bits']} | {r['M']} | {r['read_floor_us']:.1f} | {r['bf16_us']:.1f} | "
            f"{r['marlin_us']:.1f} | {r['dequant_us']:.1f} | {r['dequant_alone_us']:.1f} | {r['marlin_vs_bf16']:.2f} | "
            f"{r['dequant_vs_bf16']:.2f} | {r['winner_w4']} | {r['dispatch_route']} | {r['dispatch_us']:.1f} | "
            f"{r['dispatch_vs_bf16']:.2f} | {r['dispatch_vs_marlin']:.2f} | {r['dispatch_vs_floor']:.1f} | "
            f"{r['marlin_err']:.1e} | {r['dequant_err']:.1e} | {r['dispatch_err']:.1e} |")
    best = any("best_ms" in r for r in res["rollup"])  # results from before issue 30 have no best / floor
    lines += ["", "| step | recipe | Marlin only | with the dispatch |" + (" best route per linear | read floor |" if best else ""),
              "|---|---|---:|---:|" + ("---:|---:|" if best else "")]
    for r in res["rollup"]:
        step = "prefill chunk of 8192 tokens" if r["M"] == 8192 else f"decode step, {r['M']} running"
        lines.append(f"| {step} | {r['recipe']} | {r['marlin_ms']:.2f} ms ({r['marlin_vs_bf16']:.2f}x) | "
                     f"{r['dispatch_ms']:.2f} ms ({r['dispatch_vs_bf16']:.2f}x) |"
                     + (f" {r['best_ms']:.2f} ms ({r['best_vs_floor']:.2f}x floor) | {r['floor_ms']:.2f} ms |" if best else ""))
    if any("splitk_us" in r for r in res["rows"]):
        lines += ["", render_splitk(res)]
    return "\n".join(lines)


def compare_kernels(bench: dict, kernels: dict) -> dict:
    """Per route, the ratios `soarpack kernels` time / this benchmark's phase-1 time over every (class, bits, M)
    both measured: (min, median, max, count). The issue asks for the two tables to match within noise."""
    mine = {(r["class"], r["bits"], r["M"]): r for r in bench["rows"]}
    ratios = {}
    for r in kernels["rows"]:
        b = mine.get((r["class"], r["bits"], r["M"]))
        for rt in ("bf16", "marlin", "dequant", "splitk"):
            if b and r.get(f"{rt}_us") and b.get(f"{rt}_us"):
                ratios.setdefault(rt, []).append(r[f"{rt}_us"] / b[f"{rt}_us"])
    return {rt: (min(v), statistics.median(v), max(v), len(v)) for rt, v in ratios.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ext", type=Path, default=Path("missing.so"))
    ap.add_argument("--fork", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--classes", default=",".join(SHAPES))
    ap.add_argument("--bits", default="4,8")
    ap.add_argument("--tune", action="store_true",
                    help="also time the dequantization under other Triton tilings (reported only)")
    ap.add_argument("--splitk-sweep", action="store_true",
                    help="also time the split-K kernel under every config of w4_splitk.SPLITK_CONFIGS (W4, M <= 16)")
    ap.add_argument("--render", type=Path, help="print the markdown tables of a --json file and exit (no GPU)")
    ap.add_argument("--compare-kernels", type=Path, metavar="KERNELS_JSON",
                    help="with --render: how `soarpack kernels --out` times compare with this run's (no GPU)")
    args = ap.parse_args()
    if args.render:
        bench = json.loads(args.render.read_text())
        if args.compare_kernels:
            for rt, (lo, med, hi, n) in compare_kernels(bench, json.loads(args.compare_kernels.read_text())).items():
                print(f"soarpack kernels / benchmark, {rt}: median {med:.3f}, range {lo:.3f}-{hi:.3f} over {n} rows")
            return
        print(render_markdown(bench))
        return

    torch.backends.cuda.matmul.allow_tf32 = False
    global HAVE_MARLIN, SWEEP
    SWEEP = args.splitk_sweep
    try:
        marlin = load_marlin(str(args.ext) if args.ext.is_file() else None)  # sgl_kernel first, else --ext
    except Exception as exc:  # keep the bf16 and dequant measurements
        marlin = None
        print(f"cannot load {args.ext}: {exc!r}"[:300])
    if marlin is None:
        HAVE_MARLIN = False
        print("NO MARLIN: neither sgl_kernel nor --ext; bf16 and dequant only")
    if args.fork:  # the block as a patched tree has it
        from w4_dispatch_block import load_block

        block = load_block(args.fork)
    else:  # the block as patch 04 adds it (the same lines; no fork tree needed)
        from soarpack.kernels.block import load_dispatch_block

        block = load_dispatch_block()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "marlin": marlin,
           "thresholds": {f"{c}:{b}": v for (c, b), v in block.SOARPACK_W4_ACTIVE.items()}}
    res["ceilings"] = device_ceilings()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.tune:
        res["tune"] = tune(block, gen)
    res["configuration"] = {"tiling": {c: list(t) for c, t in block.SOARPACK_DEQUANT_TILING.items()}}
    ms = sorted(set(M_TABLE) | set(M_EXTRA))
    rows = []
    for bits in (int(b) for b in args.bits.split(",")):
        for cls in args.classes.split(","):
            rows.extend(bench_shape(block, cls, bits, ms, res["ceilings"], gen))
            print(f"  {cls} W{bits} done at {time.time() - t0:.0f} s", flush=True)
            if args.json:
                args.json.write_text(json.dumps(dict(res, rows=rows), indent=1))
    res["rows"] = rows
    res["suggested_thresholds"] = suggest_thresholds(rows)
    res["thresholds_used"] = {f"{c}:{b}": v for (c, b), v in block.SOARPACK_W4_ACTIVE.items()}
    complete = set(args.classes.split(",")) == set(SHAPES) and set(args.bits.split(",")) == {"4", "8"}
    res["rollup"] = rollup(rows) if complete else []
    res["seconds"] = time.time() - t0
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print_tables(res)


if __name__ == "__main__":
    main()
