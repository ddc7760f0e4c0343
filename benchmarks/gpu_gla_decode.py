"""Patch 06 (gla-decode-in-place) on a GPU: bit-identity with the fork's decode path, and the Lightning decode layer.

    python benchmarks/gpu_gla_decode.py --prepare .gla     # here: fla-core's wheel + the fork's pristine file
    python3 benchmarks/gpu_gla_decode.py --fork-src .gla/hybrid_linear_attn_backend.py --json $OUT/gla_decode.json
    TRITON_INTERPRET=1 python benchmarks/gpu_gla_decode.py --tiny     # CPU rehearsal of every code path

Both paths are the patched fork file's own `SimpleGLAAttnBackend.forward` (benchmarks/gla_decode_harness.py):
SOARPACK_GLA_DECODE=inplace runs the patch's kernel on the pool; =fork runs the fork's lines (gather
`temporal[mamba_indices]`, fla-core 0.6.0's fused_recurrent_simple_gla, scatter back). fp32 state pools
[S + 1, 32, 128, 128] (the last slot is MambaPool's dummy), bf16 q/k/v as views into one fused qkv row.

(a) Identity, per warp count W in --warps (fla's fused recurrent kernel forced to W warps: its partial outputs'
    reduction order depends on it; fla autotunes it between 4 and 8, and the run reports which it picks) and per
    batch B in --batches: --steps consecutive decode steps with a spread of slots over the pool (random,
    non-contiguous) and max(1, B // 6) padded rows (B > 1) (slot -1, an empty sequence, as a CUDA-graph replay pads). Eager, then
    under CUDA graphs: one captured step per path, replayed --steps times with fresh q/k/v, one more request
    finishing (its row padded) every 64 replays. Every step's output rows and, every 64 steps and at the end,
    the whole pools (untouched slots and the dummy slot included) must be bit-identical.
(b) Time: one decode step of --layers Lightning layers (each its own pool, so the state is not cache-resident)
    captured in a CUDA graph, replays timed with CUDA events (median); per layer µs. Paths: the fork's (fla
    autotuned as in the server) and the in-place kernel at each W. State bytes moved per layer step (counted from
    the kernels' reads and writes; q, k, v and o are under 1 % and left out): fork 6 x B x 2 MiB (gather read +
    write, fla read + write, scatter read + write), in place 2 x B x 2 MiB. Floor: 2 x B x 2 MiB over the copy
    bandwidth measured in the same run (a device-to-device copy, bytes read + written).
Prints one table last; --json keeps every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import gla_decode_harness as H  # noqa: E402

FLA_WHEEL = "fla-core==0.6.0"
FORK_ARCHIVE = "d29fb130c-python.tar.gz"
PAD_EVERY = 64  # replays between two requests finishing, in the graph identity run
POOL_CHECK_EVERY = 64


def prepare(dest: Path) -> None:
    """Here, before a lease: fla-core's wheel and the fork's pristine hybrid_linear_attn_backend.py into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "-d", str(dest), FLA_WHEEL], check=True)
    archive = next((p / "shared" / "data" / "sglang-fork" / FORK_ARCHIVE for p in (ROOT, *ROOT.parents)
                    if (p / "shared" / "data" / "sglang-fork" / FORK_ARCHIVE).is_file()), None)
    if archive is None:
        raise SystemExit(f"error: {FORK_ARCHIVE} not found in shared/data/sglang-fork beside the checkout")
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("python/" + H.BACKEND))
        (dest / Path(H.BACKEND).name).write_bytes(tar.extractfile(member).read())
    for p in sorted(dest.iterdir()):
        print(f"{p}  {p.stat().st_size / 2**20:.2f} MiB")


def default_fork_src() -> Path:
    for p in (ROOT, *ROOT.parents):
        cand = p / "shared" / "data" / "sglang-fork" / FORK_ARCHIVE
        if cand.is_file():
            return cand
    raise SystemExit("error: pass --fork-src (the fork's pristine hybrid_linear_attn_backend.py, python/ dir or tarball)")


# -- (a) identity ------------------------------------------------------------------------------------------------


def _pools_diff(a, b) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        d = H.first_difference(x, y)
        if d:
            return f"pool {i}: {d}"
    return ""


def identity_eager(fw, case: H.Case, steps: int) -> dict:
    pools = {m: case.pools() for m in fw}
    be = {m: f.backend(pools[m], [0], case.g_gamma, case.scale) for m, f in fw.items()}
    slots, qsl = H.replay_metadata(case.live_slots, case.batch, case.device)
    for b in be.values():
        H.set_metadata(b, slots, qsl)
    out_diff = state_diff = ""
    for step in range(steps):
        got, want = H.step_pair(be["inplace"], be["fork"], *case.qkv(), 0)
        out_diff = out_diff or _tag(step, H.first_difference(got[:case.live], want[:case.live]))
        if (step + 1) % POOL_CHECK_EVERY == 0 or step == steps - 1:
            state_diff = state_diff or _tag(step, _pools_diff(pools["inplace"], pools["fork"]))
    untouched = _untouched_diff(pools["inplace"], case, case.live_slots)
    return {"outputs": out_diff or "identical", "states": state_diff or "identical", "untouched": untouched or "identical"}


def _tag(step: int, diff: str) -> str:
    return f"step {step}: {diff}" if diff else ""


def _untouched_diff(pools, case, touched) -> str:
    rest = [s for s in range(case.slots_total + 1) if s not in set(touched)]
    for got, start in zip(pools, case.initial):
        d = H.first_difference(got[rest], start[rest])
        if d:
            return d
    return ""


def identity_graph(fw, case: H.Case, steps: int) -> dict:
    """One captured decode step per path at batch case.batch, replayed `steps` times (fresh q/k/v each time);
    every PAD_EVERY replays the last live request finishes: its row becomes padded as _replay_metadata pads."""
    dev = case.device
    pools = {m: case.pools() for m in fw}
    scratch = {m: case.pools() for m in fw}
    fused = case.fused_qkv()
    slots, qsl = H.replay_metadata(case.live_slots, case.batch, dev)
    graphs, outs = {}, {}
    for m, f in fw.items():
        warm = f.backend(scratch[m], [0], case.g_gamma, case.scale)  # compile and load outside the capture
        H.set_metadata(warm, slots, qsl)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                warm.forward(*case.split(fused), H.decode_batch(), 0)
        torch.cuda.current_stream().wait_stream(side)
        be = f.backend(pools[m], [0], case.g_gamma, case.scale)
        H.set_metadata(be, slots, qsl)
        graphs[m] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[m]):
            outs[m] = be.forward(*case.split(fused), H.decode_batch(), 0)
    live = list(case.live_slots)
    touched = set(live)
    out_diff = state_diff = ""
    for step in range(steps):
        if step and step % PAD_EVERY == 0 and len(live) > 1:
            live.pop()
            new_slots, new_qsl = H.replay_metadata(live, case.batch, dev)
            slots.copy_(new_slots)
            qsl.copy_(new_qsl)
        fused.copy_(case.fused_qkv())
        for m in ("inplace", "fork"):
            graphs[m].replay()
        n = len(live)
        out_diff = out_diff or _tag(step, H.first_difference(outs["inplace"][:n], outs["fork"][:n]))
        if (step + 1) % POOL_CHECK_EVERY == 0 or step == steps - 1:
            state_diff = state_diff or _tag(step, _pools_diff(pools["inplace"], pools["fork"]))
    return {"outputs": out_diff or "identical", "states": state_diff or "identical",
            "untouched": _untouched_diff(pools["inplace"], case, touched) or "identical", "live_at_end": len(live)}


def padded_rows(batch: int) -> int:
    """Padded rows in an identity run: 1 of 8, 5 of 32 (a replay pads the captured size up to it)."""
    return max(1, batch // 6) if batch > 1 else 0


def run_identity(args, fw) -> list:
    rows = []
    for nw in args.warps:
        H.force_fla_num_warps(nw)
        fw["inplace"].block.SOARPACK_GLA_DECODE_NUM_WARPS = nw
        for batch in args.batches:
            case = H.Case(batch=batch, live=batch - padded_rows(batch), heads=args.heads, dim=args.dim,
                          slots_total=args.slots, seed=1000 * nw + batch, device=args.device)
            modes = [("eager", identity_eager)] + ([("graph", identity_graph)] if args.device == "cuda" else [])
            for mode, fn in modes:
                t0 = time.perf_counter()
                res = fn(fw, case, args.steps)
                rows.append(dict(warps=nw, batch=batch, live=case.live, mode=mode, steps=args.steps,
                                 seconds=round(time.perf_counter() - t0, 2), **res))
                print(f"identity W={nw} B={batch} live={case.live} {mode}: outputs {res['outputs']}; states "
                      f"{res['states']}; untouched slots {res['untouched']}", flush=True)
    H.force_fla_num_warps(None)
    fw["inplace"].block.SOARPACK_GLA_DECODE_NUM_WARPS = args.warps[0] if args.warps else 4
    return rows


def fla_autotune_choice(fw, args) -> str:
    """Which num_warps fla's own autotuner picks for the decode shape on this device (None: not tuned here)."""
    tuner = H.force_fla_num_warps(None)
    if args.device != "cuda":
        return "not tuned (CPU rehearsal)"
    case = H.Case(batch=8, live=8, heads=args.heads, dim=args.dim, slots_total=8, seed=7, device=args.device)
    be = fw["fork"].backend(case.pools(), [0], case.g_gamma, case.scale)
    H.set_metadata(be, *H.replay_metadata(case.live_slots, case.batch, args.device))
    be.forward(*case.qkv(), H.decode_batch(), 0)
    torch.cuda.synchronize()
    best = getattr(tuner, "best_config", None)
    return f"num_warps={best.num_warps}" if best is not None else "unknown"


# -- (b) time ----------------------------------------------------------------------------------------------------


def copy_bandwidth(device: str) -> float:
    """Bytes read + written per second by a device-to-device copy of 2 GiB (median of 10)."""
    if device != "cuda":
        return float("nan")
    src = torch.randn(2**29, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    times = []
    for i in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) / 1000)
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / statistics.median(times)


def time_step(f, case: H.Case, layers: int, replays: int, device: str) -> float:
    """Seconds per decode step of `layers` Lightning layers (each its own pool), graph-replayed (eager on a CPU)."""
    pools = case.pools()
    be = f.backend(pools, list(range(layers)), case.g_gamma, case.scale)
    H.set_metadata(be, *H.replay_metadata(case.live_slots, case.batch, device))
    fused = case.fused_qkv()

    def step():
        q, k, v = case.split(fused)
        return [be.forward(q, k, v, H.decode_batch(), layer) for layer in range(layers)]

    if device != "cuda":
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile, autotune (fla), load
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    del graph, pools
    torch.cuda.empty_cache()
    return statistics.median(times)


def run_timing(args, fw) -> dict:
    bw = copy_bandwidth(args.device)
    per_request = H.state_bytes(args.heads, args.dim)
    rows = []
    # the fork's path as the server runs it: fla autotuned (the interpreter cannot benchmark: one config there)
    tuner = H.force_fla_num_warps(None if args.device == "cuda" else args.warps[0])
    paths = [("fork", "fork", None)] + [(f"inplace W={nw}", "inplace", nw) for nw in args.warps]
    for batch in args.batches:
        case = H.Case(batch=batch, live=batch, heads=args.heads, dim=args.dim, slots_total=batch + batch // 2 + 1,
                      layers=args.layers, seed=batch, device=args.device)
        fork_t = None
        for label, mode, nw in paths:
            if nw is not None:
                fw[mode].block.SOARPACK_GLA_DECODE_NUM_WARPS = nw
            t = time_step(fw[mode], case, args.layers, args.replays, args.device) / args.layers
            moved = (6 if mode == "fork" else 2) * batch * per_request
            fork_t = t if mode == "fork" else fork_t
            if mode == "fork":
                best = getattr(tuner, "best_config", None)
                label = f"fork (fla {'autotuned' if best is None else f'W={best.num_warps}'})"
            rows.append(dict(batch=batch, path=label, us=t * 1e6, state_bytes=moved, gbps=moved / t / 1e9,
                             x_fork_time=t / fork_t, x_fork_bytes=moved / (6 * batch * per_request),
                             floor_us=2 * batch * per_request / bw * 1e6))
            print(f"time B={batch} {label}: {t * 1e6:.1f} us per layer step", flush=True)
    fw["inplace"].block.SOARPACK_GLA_DECODE_NUM_WARPS = args.warps[0] if args.warps else 4
    return {"copy_bandwidth_Bps": bw, "rows": rows}


def render(result: dict, rehearsal: bool) -> str:
    out = []
    if rehearsal:
        out.append("CPU rehearsal under Triton's interpreter: the identity rows are real checks, the times are not")
    out.append(f"fla's autotuner picks {result['fla_autotune']} for the decode shape")
    out.append("")
    out.append("| W | batch | live | mode | steps | outputs | states | untouched slots |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in result["identity"]:
        out.append(f"| {r['warps']} | {r['batch']} | {r['live']} | {r['mode']} | {r['steps']} | {r['outputs']} | "
                   f"{r['states']} | {r['untouched']} |")
    t = result["timing"]
    out.append("")
    out.append(f"copy bandwidth (read + write) {t['copy_bandwidth_Bps'] / 1e12:.2f} TB/s")
    out.append("| batch | path | µs / layer step | state MB moved | GB/s | × fork time | × fork bytes | floor µs | × floor |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in t["rows"]:
        out.append(f"| {r['batch']} | {r['path']} | {r['us']:.1f} | {r['state_bytes'] / 1e6:.1f} | {r['gbps']:.0f} | "
                   f"{r['x_fork_time']:.2f} | {r['x_fork_bytes']:.2f} | {r['floor_us']:.1f} | "
                   f"{r['us'] / r['floor_us']:.2f} |")
    out.append("")
    for batch in (8, 32):
        mine = [r for r in t["rows"] if r["batch"] == batch and r["path"].startswith("inplace")]
        if mine:
            best = min(mine, key=lambda r: r["us"])
            out.append(f"issue 38 at batch {batch}: bytes {best['x_fork_bytes']:.2f}x the fork's (bar <= 0.4), "
                       f"time {best['x_fork_time']:.2f}x ({best['path']}; bar <= 0.6 at batch 32)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", type=Path, help="write fla-core's wheel and the fork's pristine file here and exit")
    ap.add_argument("--fork-src", type=Path, help="the fork's pristine hybrid_linear_attn_backend.py, python/ or tarball")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--slots", type=int, default=64, help="pool slots in the identity runs (plus the dummy)")
    ap.add_argument("--layers", type=int, default=24, help="Lightning layers per timed step")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--tiny", action="store_true", help="rehearsal sizes (2 heads, 2 steps, batches 1,4, 2 layers)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return
    if args.tiny:
        args.heads, args.steps, args.batches, args.warps = 2, 2, "1,4", "4"
        args.slots, args.layers, args.replays = 8, 2, 1
    args.batches = [int(x) for x in str(args.batches).split(",")]
    args.warps = [int(x) for x in str(args.warps).split(",")]
    args.device = "cuda" if torch.cuda.is_available() and not H.interpreting() else "cpu"
    if args.device == "cpu" and not H.interpreting():
        raise SystemExit("error: no CUDA device: rehearse with TRITON_INTERPRET=1 ... --tiny")
    backend_file = H.patched_backend_file(args.fork_src or default_fork_src(), H.tmpdir("gla-decode-"))
    fla = H.load_fla()
    fw = {m: H.Forward(backend_file, m, fla) for m in ("inplace", "fork")}
    import triton

    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "triton": triton.__version__, "args": {k: str(v) for k, v in vars(args).items()}}
    result["fla_autotune"] = fla_autotune_choice(fw, args)
    result["identity"] = run_identity(args, fw)
    result["timing"] = run_timing(args, fw)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    print(render(result, args.device != "cuda"))
    bad = [r for r in result["identity"] if {r["outputs"], r["states"], r["untouched"]} != {"identical"}]
    if bad:
        raise SystemExit(f"error: {len(bad)} identity run(s) differ (table above)")


if __name__ == "__main__":
    main()
