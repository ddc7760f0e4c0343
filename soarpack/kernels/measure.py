"""`soarpack kernels`: the W4 dispatch's measurement on the user's own GPU, for the shapes and widths of a checkpoint
or of the built-in recipes, and the dispatch thresholds it would choose. Torch-free: the timing and the kernels are
a backend's (soarpack.kernels.cuda on a CUDA GPU; a stand-in in the tests).

A backend has `describe() -> dict` (device, torch, marlin: which Marlin ran, or None), `ceilings() -> dict`
(read_GBps: the read bandwidth measured in this run) and `measure(size_n, size_k, bits, ms) -> {M: {route_us,
route_err}}` for routes bf16, marlin, dequant, splitk (W4, M <= 16) and dispatch (patch 04's own routing); bits None
measures bf16 only (a shape the workload leaves unquantized).
"""

from __future__ import annotations

import importlib
import os
from typing import Dict, Iterable, List, Optional, Sequence

from soarpack.errors import ConfigError
from soarpack.kernels.thresholds import choose_thresholds, dispatch_spec
from soarpack.kernels.workload import Workload, shape_class

M_DEFAULT = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192)
DECODE_M = (1, 8, 32)
PREFILL_M = 8192
W4_ROUTES = ("marlin", "dequant", "splitk")
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
            if bits:
                w4 = {rt: r[f"{rt}_us"] for rt in W4_ROUTES if r.get(f"{rt}_us") is not None}
                r["winner"] = min(w4, key=w4.get) if w4 else None
                for rt in W4_ROUTES + ("dispatch",):
                    us = r.get(f"{rt}_us")
                    if us is not None:
                        r[f"{rt}_vs_floor"] = us / r["read_floor_us"]
                        r[f"{rt}_vs_bf16"] = us / r["bf16_us"]
                        if r.get("marlin_us"):
                            r[f"{rt}_vs_marlin"] = us / r["marlin_us"]
            rows.append(r)
    thresholds = choose_thresholds(rows)
    splitk = {f"{r['class']}:{r['bits']}:{r['M']}": round(r["splitk_us"] / r["marlin_us"], 3)
              for r in rows if r.get("splitk_us") is not None and r.get("marlin_us")}
    return {"device": desc, "ceilings": ceilings, "M": ms, "rows": rows,
            "thresholds": {f"{c}:{b}": v for (c, b), v in sorted(thresholds.items())},
            "dispatch_env": dispatch_spec(thresholds),
            "splitk_vs_marlin": splitk,
            "rollup": rollup(workloads, rows, thresholds, ms)}


def _route_time(row: dict, route: str, thresholds: dict, dispatchable: bool) -> Optional[float]:
    if route == "chosen":
        thr = thresholds.get((row["class"], row["bits"]))
        route = "dequant" if dispatchable and thr is not None and row["M"] >= thr else "marlin"
    elif route == "best":
        vals = [row.get(f"{rt}_us") for rt in (W4_ROUTES if dispatchable else ("marlin",))]
        vals = [v for v in vals if v is not None]
        return min(vals) if vals else None
    elif route == "dispatch" and not dispatchable:
        route = "marlin"
    return row.get(f"{route}_us")


ROLLUP_ROUTES = ("bf16", "marlin", "dispatch", "chosen", "best", "floor")


def rollup(workloads: Sequence[Workload], rows: List[dict], thresholds: dict, ms: Sequence[int]) -> List[dict]:
    """Per workload, the decoder's linears summed for a decode step (M = 1, 8, 32 where measured) and a prefill chunk
    (M = 8192, or the largest measured): bf16 (everything 16-bit), Marlin only, the patch's dispatch as measured,
    the dispatch with the chosen thresholds, the best measured route per linear, and the read floor. ms."""
    table = {(r["size_n"], r["size_k"], r["bits"], r["M"]): r for r in rows}
    bf16_of = {}  # every row of a shape times bf16 on it; any one serves a 16-bit linear of that shape
    for r in rows:
        bf16_of.setdefault((r["size_n"], r["size_k"], r["M"]), r)
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
                        us = bf["bf16_read_floor_us"] if rt == "floor" else bf_us
                    elif rt == "floor":
                        us = q["read_floor_us"]
                    else:
                        us = _route_time(q, rt, thresholds, ln.dispatchable)
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
             f"{'shape':>12} {'class':>13} {'b':>2} {'M':>5} {'floor':>7} {'bf16':>8} {'marlin':>8} {'dq+mm':>8} "
             f"{'splitk':>8} {'disp':>8} {'win':>8} {'best/fl':>7}"]
    for r in res["rows"]:
        best = r.get(f"{r['winner']}_vs_floor") if r.get("winner") else None
        lines.append(f"{r['shape']:>12} {r['class']:>13} {r['bits']:>2} {r['M']:>5} {_f(r.get('read_floor_us', r['bf16_read_floor_us'])):>7} "
                     f"{_f(r.get('bf16_us')):>8} {_f(r.get('marlin_us')):>8} {_f(r.get('dequant_us')):>8} "
                     f"{_f(r.get('splitk_us')):>8} {_f(r.get('dispatch_us')):>8} {r.get('winner') or '-':>8} {_f(best, '.2f'):>7}")
    lines += ["", f"{'workload':>40} {'step':>8} {'M':>5} " + " ".join(f"{rt:>14}" for rt in ROLLUP_ROUTES)]
    for r in res["rollup"]:
        cells = " ".join(f"{_f(r[f'{rt}_ms'], '.2f') + ' ms':>9}({_f(r[f'{rt}_vs_bf16'], '.2f')})" for rt in ROLLUP_ROUTES)
        lines.append(f"{r['workload'][-40:]:>40} {r['step']:>8} {r['M']:>5} {cells}")
    lines += ["", "thresholds (Marlin below, dequantize + bf16 GEMM from):",
              "  " + ", ".join(f"{k}={v}" for k, v in res["thresholds"].items()),
              f"export SOARPACK_W4_DISPATCH={res['dispatch_env']}"]
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
    return [bf16_workload()] + [recipe_workload(name) for name in (recipes or list_recipes())]


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
