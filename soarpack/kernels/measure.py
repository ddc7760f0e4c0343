"""`soarpack kernels`: the W4 dispatch's and the FP8 route's measurement on the user's own GPU, for the shapes and
widths of a checkpoint or of the built-in recipes, and the thresholds it would choose. Torch-free: the timing and
the kernels are a backend's (soarpack.kernels.cuda on a CUDA GPU; a stand-in in the tests).

A backend has `describe() -> dict` (device, torch, marlin: which Marlin ran, or None), `ceilings() -> dict`
(read_GBps: the read bandwidth measured in this run) and `measure(size_n, size_k, bits, ms) -> {M: {route_us,
route_err}}` for routes bf16, marlin, dequant, splitk (W4, M <= 16), dispatch (patch 04's own routing), fp8 (patch
05's FP8 route: per-token activation quantization + the FP8 GEMM on the per-channel copy), fp8_quant and fp8_gemm
(its two parts) and fp8_dispatch (patch 05's own routing); bits None measures bf16 and fp8 only (a shape the
workload leaves unquantized, which the fork's --quantization fp8 still runs through FP8).
"""

from __future__ import annotations

import importlib
import os
from typing import Dict, Iterable, List, Optional, Sequence

from soarpack.errors import ConfigError
from soarpack.kernels.thresholds import (FP8_KEPT_OFF, NEVER, choose_fp8_thresholds, choose_thresholds,
                                         dispatch_spec, fp8_spec)
from soarpack.kernels.workload import Workload, shape_class

M_DEFAULT = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DECODE_M = (1, 8, 32)
PREFILL_M = 8192
W4_ROUTES = ("marlin", "dequant", "splitk")
FP8_ROUTE = "fp8"  # patch 05's route, the activations' quantization included
# Issue 37's bar: the FP8 route at most 0.70x bf16 at these M on every shape, and Marlin the route at M <= 32.
FP8_BAR_M, FP8_BAR_RATIO, DECODE_BAR_M = (4096, 8192), 0.70, 32
BACKEND_ENV = "SOARPACK_KERNELS_BACKEND"  # module:callable returning a backend (a stand-in; tests)


def open_backend(marlin_ext: Optional[str] = None):
    """$SOARPACK_KERNELS_BACKEND's backend when set, else the CUDA one; ConfigError (exit 2) without a CUDA GPU."""
    spec = os.environ.get(BACKEND_ENV)
    if spec:
        mod, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod), attr or "backend")
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{BACKEND_ENV}={spec}: cannot load it ({exc})", "write module:callable") from exc
        return factory(marlin_ext=marlin_ext)
    try:
        from soarpack.kernels.cuda import CudaBackend, cuda_available
    except ImportError:  # no torch at all
        CudaBackend, cuda_available = None, lambda: False
    if not cuda_available():
        raise ConfigError("soarpack kernels needs a CUDA GPU: torch sees none on this machine",
                          "run it on the GPU box you want numbers for (an RTX PRO like the platform's, an H200, ...)")
    return CudaBackend(marlin_ext=marlin_ext)


def _floors(n: int, k: int, bits: Optional[int], m: int, read_gbps: float) -> dict:
    io = (m * k + m * n) * 2
    out = {"bf16_read_floor_us": (n * k * 2 + io) / (read_gbps * 1e3)}
    if bits:
        q_bytes = n * k * bits // 8 + n * (k // 128) * 2
        out["read_floor_us"] = (q_bytes + io) / (read_gbps * 1e3)
    return out


def measure_table(workloads: Sequence[Workload], backend, ms: Iterable[int] = M_DEFAULT) -> dict:
    """Every (shape, width) the workloads need, at every M: the routes' µs and errors, the read floors, the winner."""
    ms = sorted(set(int(m) for m in ms))
    desc = backend.describe()
    ceilings = backend.ceilings()
    quantized = sorted({ln.key for w in workloads for ln in w.linears if ln.bits != 16})
    shapes = {(n, k) for n, k, _ in quantized}
    bf16_only = sorted({(ln.size_n, ln.size_k) for w in workloads for ln in w.linears} - shapes)
    rows = []
    for n, k, bits in quantized + [(n, k, None) for n, k in bf16_only]:
        measured = backend.measure(n, k, bits, ms)
        for m in ms:
            r = {"class": shape_class(n, k), "shape": f"{n}x{k}", "size_n": n, "size_k": k, "bits": bits or 16, "M": m}
            r.update(_floors(n, k, bits, m, ceilings["read_GBps"]))
            r.update(measured[m])
            if r.get("fp8_us") is not None and r.get("bf16_us"):
                r["fp8_vs_bf16"] = r["fp8_us"] / r["bf16_us"]
            if bits:
                w4 = {rt: r[f"{rt}_us"] for rt in W4_ROUTES + (FP8_ROUTE,) if r.get(f"{rt}_us") is not None}
                r["winner"] = min(w4, key=w4.get) if w4 else None
                for rt in W4_ROUTES + ("dispatch", FP8_ROUTE, "fp8_dispatch"):
                    us = r.get(f"{rt}_us")
                    if us is not None:
                        r[f"{rt}_vs_floor"] = us / r["read_floor_us"]
                        r[f"{rt}_vs_bf16"] = us / r["bf16_us"]
                        if r.get("marlin_us"):
                            r[f"{rt}_vs_marlin"] = us / r["marlin_us"]
            rows.append(r)
    thresholds = choose_thresholds(rows)
    fp8_thresholds = choose_fp8_thresholds(rows)
    splitk = {f"{r['class']}:{r['bits']}:{r['M']}": round(r["splitk_us"] / r["marlin_us"], 3)
              for r in rows if r.get("splitk_us") is not None and r.get("marlin_us")}
    return {"device": desc, "ceilings": ceilings, "M": ms, "rows": rows,
            "thresholds": {f"{c}:{b}": v for (c, b), v in sorted(thresholds.items())},
            "dispatch_env": dispatch_spec(thresholds),
            "splitk_vs_marlin": splitk,
            "fp8_thresholds": {f"{c}:{b}": v for (c, b), v in sorted(fp8_thresholds.items())},
            "fp8_env": fp8_spec(fp8_thresholds),
            "fp8_kept_off": {f"{c}:{b}": v for (c, b), v in sorted(fp8_thresholds.items()) if c in FP8_KEPT_OFF},
            "fp8_bar": fp8_bar(rows, thresholds, fp8_thresholds, ms),
            "rollup": rollup(workloads, rows, thresholds, ms, fp8_thresholds)}


def route_of(row: dict, thresholds: dict, fp8_thresholds: Optional[dict] = None, dispatchable: bool = True,
             kept_off=FP8_KEPT_OFF) -> str:
    """The route patches 04 and 05 take for a row's M with these thresholds: fp8 from its FP8 threshold on (its
    class not kept off), dequant from its dispatch threshold on, else marlin."""
    if not dispatchable:
        return "marlin"
    key = (row["class"], row["bits"])
    f8 = (fp8_thresholds or {}).get(key)
    if f8 is not None and f8 < NEVER and row["class"] not in kept_off and row["M"] >= f8:
        return FP8_ROUTE
    thr = thresholds.get(key)
    return "dequant" if thr is not None and row["M"] >= thr else "marlin"


def fp8_bar(rows: List[dict], thresholds: dict, fp8_thresholds: dict, ms: Sequence[int]) -> dict:
    """Issue 37's bar on this table: the FP8 route (quantization included) at most FP8_BAR_RATIO x bf16 at M =
    4096 and 8192 on every shape measured, and the chosen route Marlin at every quantized row with M <= 32.
    `ok` is None when the table lacks those M or the FP8 times."""
    seen = {}
    for r in rows:  # the FP8 route does not depend on the width: one row per shape and M
        if r["M"] in FP8_BAR_M and r.get("fp8_vs_bf16") is not None:
            seen.setdefault((r["shape"], r["M"]), {"shape": r["shape"], "class": r["class"], "M": r["M"],
                                                   "fp8_vs_bf16": r["fp8_vs_bf16"],
                                                   "ok": r["fp8_vs_bf16"] <= FP8_BAR_RATIO})
    shapes = sorted(seen.values(), key=lambda x: (x["class"], x["shape"], x["M"]))
    decode = [{"shape": r["shape"], "bits": r["bits"], "M": r["M"], "route": route_of(r, thresholds, fp8_thresholds)}
              for r in rows if r["bits"] in (4, 8) and r["M"] <= DECODE_BAR_M]
    complete = bool(shapes) and all(m in ms for m in FP8_BAR_M) and \
        len(shapes) == len(FP8_BAR_M) * len({r["shape"] for r in rows})
    ok = None if not complete else all(s["ok"] for s in shapes) and all(d["route"] == "marlin" for d in decode)
    return {"ratio": FP8_BAR_RATIO, "M": list(FP8_BAR_M), "shapes": shapes,
            "decode_marlin": all(d["route"] == "marlin" for d in decode) if decode else None,
            "decode_not_marlin": [d for d in decode if d["route"] != "marlin"], "ok": ok}


def _route_time(row: dict, route: str, thresholds: dict, dispatchable: bool,
                fp8_thresholds: Optional[dict] = None) -> Optional[float]:
    if route == "chosen":
        route = route_of(row, thresholds, None, dispatchable)
    elif route == "fp8_prefill":
        route = route_of(row, thresholds, fp8_thresholds, dispatchable)
    elif route == "fp8_all":
        route = FP8_ROUTE
    elif route == "best":
        vals = [row.get(f"{rt}_us") for rt in (W4_ROUTES + (FP8_ROUTE,) if dispatchable else ("marlin",))]
        vals = [v for v in vals if v is not None]
        return min(vals) if vals else None
    elif route == "dispatch" and not dispatchable:
        route = "marlin"
    return row.get(f"{route}_us")


# chosen: patch 04 with the chosen thresholds; fp8_prefill: patches 04 + 05 with the chosen thresholds (profile
# fast-fp8; 16-bit linears stay bf16); fp8_all: every linear through FP8 at every M (the fork's --quantization fp8,
# profile fp8, on the bf16 workload)
ROLLUP_ROUTES = ("bf16", "marlin", "dispatch", "chosen", "fp8_prefill", "fp8_all", "best", "floor")


def rollup(workloads: Sequence[Workload], rows: List[dict], thresholds: dict, ms: Sequence[int],
           fp8_thresholds: Optional[dict] = None) -> List[dict]:
    """Per workload, the decoder's linears summed for a decode step (M = 1, 8, 32 where measured) and a prefill chunk
    (M = 8192, or the largest measured): bf16 (everything 16-bit), Marlin only, the patch's dispatch as measured,
    the dispatch with the chosen thresholds, patches 04 + 05 with the chosen thresholds, every linear through FP8,
    the best measured route per linear, and the read floor. ms."""
    table = {(r["size_n"], r["size_k"], r["bits"], r["M"]): r for r in rows}
    bf16_of = {}  # every row of a shape times bf16 on it; any one serves a 16-bit linear of that shape
    same_shape: Dict[tuple, List[dict]] = {}  # and FP8, on any row that measured it
    for r in rows:
        bf16_of.setdefault((r["size_n"], r["size_k"], r["M"]), r)
        same_shape.setdefault((r["size_n"], r["size_k"], r["M"]), []).append(r)
    steps = [("decode", m) for m in DECODE_M if m in ms] + [("prefill", PREFILL_M if PREFILL_M in ms else max(ms))]
    out = []
    for w in workloads:
        for step, m in steps:
            tot = {rt: 0.0 for rt in ROLLUP_ROUTES}
            missing = set()
            for ln in w.linears:
                q = table.get((ln.size_n, ln.size_k, ln.bits, m))
                bf = bf16_of[(ln.size_n, ln.size_k, m)]
                bf_us = bf["bf16_us"]
                tot["bf16"] += ln.count * bf_us
                for rt in ROLLUP_ROUTES[1:]:
                    if ln.bits == 16:
                        fp8_us = next((r.get("fp8_us") for r in same_shape[(ln.size_n, ln.size_k, m)]
                                       if r.get("fp8_us") is not None), None)
                        us = bf["bf16_read_floor_us"] if rt == "floor" else fp8_us if rt == "fp8_all" else bf_us
                    elif rt == "floor":
                        us = q["read_floor_us"]
                    else:
                        us = _route_time(q, rt, thresholds, ln.dispatchable, fp8_thresholds)
                    if us is None:
                        missing.add(rt)
                        continue
                    tot[rt] += ln.count * us
            row = {"workload": w.name, "step": step, "M": m}
            for rt in ROLLUP_ROUTES:
                row[f"{rt}_ms"] = None if rt in missing else tot[rt] / 1e3
                row[f"{rt}_vs_bf16"] = None if rt in missing or not tot["bf16"] else tot[rt] / tot["bf16"]
            out.append(row)
    return out


def _f(v, fmt=".1f") -> str:
    return "-" if v is None else format(v, fmt)


def render_text(res: dict) -> str:
    d, c = res["device"], res["ceilings"]
    lines = [f"device: {d.get('device')}  torch {d.get('torch')}  Marlin: {d.get('marlin') or 'none (not measured)'}"
             f"  split-K kernel: {'yes' if d.get('triton') else 'no (no triton)'}",
             f"read floor from this run: {c['read_GBps']:.0f} GB/s", "",
             f"FP8 ops: {d.get('fp8') or 'none (FP8 not measured)'}", "",
             f"{'shape':>12} {'class':>13} {'b':>2} {'M':>5} {'floor':>7} {'bf16':>8} {'marlin':>8} {'dq+mm':>8} "
             f"{'splitk':>8} {'disp':>8} {'fp8':>8} {'f8/bf16':>7} {'f8quant':>8} {'win':>8} {'best/fl':>7}"]
    for r in res["rows"]:
        best = r.get(f"{r['winner']}_vs_floor") if r.get("winner") else None
        lines.append(f"{r['shape']:>12} {r['class']:>13} {r['bits']:>2} {r['M']:>5} {_f(r.get('read_floor_us', r['bf16_read_floor_us'])):>7} "
                     f"{_f(r.get('bf16_us')):>8} {_f(r.get('marlin_us')):>8} {_f(r.get('dequant_us')):>8} "
                     f"{_f(r.get('splitk_us')):>8} {_f(r.get('dispatch_us')):>8} {_f(r.get('fp8_us')):>8} "
                     f"{_f(r.get('fp8_vs_bf16'), '.2f'):>7} {_f(r.get('fp8_quant_us')):>8} {r.get('winner') or '-':>8} "
                     f"{_f(best, '.2f'):>7}")
    lines += ["", f"{'workload':>40} {'step':>8} {'M':>5} " + " ".join(f"{rt:>14}" for rt in ROLLUP_ROUTES)]
    for r in res["rollup"]:
        cells = " ".join(f"{_f(r[f'{rt}_ms'], '.2f') + ' ms':>9}({_f(r[f'{rt}_vs_bf16'], '.2f')})" for rt in ROLLUP_ROUTES)
        lines.append(f"{r['workload'][-40:]:>40} {r['step']:>8} {r['M']:>5} {cells}")
    lines += ["", "thresholds (Marlin below, dequantize + bf16 GEMM from):",
              "  " + ", ".join(f"{k}={v}" for k, v in res["thresholds"].items()),
              f"export SOARPACK_W4_DISPATCH={res['dispatch_env']}"]
    if res.get("fp8_thresholds"):
        def shown(v):
            return "never" if v >= NEVER else str(v)

        lines += ["", "FP8 thresholds (patch 04's route below, FP8 from; never: FP8 lost at the largest M):",
                  "  " + ", ".join(f"{k}={shown(v)}" for k, v in res["fp8_thresholds"].items()),
                  f"export SOARPACK_FP8_PREFILL={res['fp8_env']}"]
        kept = {k: v for k, v in res.get("fp8_kept_off", {}).items() if v < NEVER}
        if kept:
            lines.append("  kept off (accuracy undecided: the sparse layers' q/k pick the top-k blocks), FP8 faster from "
                         + ", ".join(f"{k}={v}" for k, v in kept.items()) + "; to measure them on: "
                         + ",".join(f"{k}={v}" for k, v in kept.items()))
    bar = res.get("fp8_bar")
    if bar and bar.get("shapes"):
        worst = max(bar["shapes"], key=lambda s: s["fp8_vs_bf16"])
        verdict = {True: "MET", False: "NOT MET", None: "not judged (the table lacks M = 4096 and 8192 or a shape)"}
        lines += ["", f"issue 37's bar (FP8 <= {bar['ratio']:.2f}x bf16 at M = {', '.join(map(str, bar['M']))} on every "
                      f"shape; Marlin at M <= {DECODE_BAR_M}): {verdict[bar['ok']]}; worst {worst['shape']} "
                      f"({worst['class']}) at M = {worst['M']}: {worst['fp8_vs_bf16']:.2f}x"]
        lines += [f"  not Marlin at decode: {d['shape']} W{d['bits']} M = {d['M']} -> {d['route']}"
                  for d in bar.get("decode_not_marlin", [])]
    return "\n".join(lines)


def workloads_for(ckpt=None, recipes: Sequence[str] = ()) -> List[Workload]:
    """The checkpoint's workload, or the named recipes', or (neither given) every built-in recipe's; bf16 always
    first, as the baseline of the roll-up."""
    from soarpack.kernels.workload import bf16_workload, checkpoint_workload, recipe_workload
    from soarpack.recipe.model import list_recipes

    if ckpt is not None and recipes:
        raise ConfigError("give a checkpoint or --recipe, not both", "soarpack kernels CKPT, or soarpack kernels --recipe w4-mlp")
    if ckpt is not None:
        return [bf16_workload(), checkpoint_workload(ckpt)]
    out = [bf16_workload()]
    for name in recipes or list_recipes():
        w = recipe_workload(name)
        if w.shapes() or recipes:  # a built-in recipe that quantizes nothing (bf16) is the baseline itself
            out.append(w)
    return out


def run_kernels(ckpt=None, recipes: Sequence[str] = (), ms: Iterable[int] = M_DEFAULT, backend=None,
                marlin_ext: Optional[str] = None) -> dict:
    """`soarpack kernels` as a function: the table, the roll-up and the thresholds, as one JSON-ready dict."""
    try:  # bad input is reported before any GPU work
        workloads = workloads_for(ckpt, recipes)
    except ImportError:  # no torch: the release shape needs it, and so does any measurement (next line says so)
        workloads = None
    backend = backend or open_backend(marlin_ext)
    workloads = workloads or workloads_for(ckpt, recipes)
    res = measure_table(workloads, backend, ms)
    res["workloads"] = [{"name": w.name, "source": w.source,
                         "linears": [dict(ln.__dict__) for ln in w.linears]} for w in workloads]
    res["checks"] = getattr(backend, "checks", {})
    return res
