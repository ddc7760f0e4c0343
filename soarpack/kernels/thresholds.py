"""The dispatch thresholds a measured table implies, written the way patch 04-w4-dispatch reads them
(SOARPACK_W4_DISPATCH = CLASS:BITS=M,...: Marlin below M rows, dequantize + bf16 GEMM from M). Torch-free."""

from __future__ import annotations

from typing import Dict, Iterable, Tuple

NEVER = 1 << 30  # a threshold no batch reaches: the dequantizing route never won at the largest measured M


def choose_thresholds(rows: Iterable[dict]) -> Dict[Tuple[str, int], int]:
    """Per (class, bits): the smallest measured M from which dequantize + matmul beat Marlin at every larger
    measured M; NEVER when Marlin won at the largest M. Rows of one class but several shapes ("other") take the
    largest (the route must be right for every one of them). Rows without both times are skipped."""
    per_shape: Dict[Tuple[str, int, str], list] = {}
    for r in rows:
        if r.get("bits") in (4, 8) and r.get("marlin_us") is not None and r.get("dequant_us") is not None:
            per_shape.setdefault((r["class"], r["bits"], r["shape"]), []).append(r)
    out: Dict[Tuple[str, int], int] = {}
    for (cls, bits, _), rs in per_shape.items():
        thr = NEVER
        for r in sorted(rs, key=lambda r: r["M"], reverse=True):
            if r["dequant_us"] < r["marlin_us"]:
                thr = r["M"]
            else:
                break
        out[(cls, bits)] = max(out.get((cls, bits), 0), thr)
    return out


def dispatch_spec(thresholds: Dict[Tuple[str, int], int]) -> str:
    """The SOARPACK_W4_DISPATCH text for these thresholds ("" when there are none: the patch's defaults)."""
    return ",".join(f"{cls}:{bits}={m}" for (cls, bits), m in sorted(thresholds.items()))


# The classes whose FP8 threshold `fp8_spec` writes as "off" whatever was measured: the sparse layers' q/k/v feed
# the top-k block selection, and whether FP8 there costs accuracy is undecided (patch 05 keeps them off by default).
FP8_KEPT_OFF = ("sparse_qkv",)


def choose_fp8_thresholds(rows: Iterable[dict]) -> Dict[Tuple[str, int], int]:
    """Per (class, bits): the smallest measured M from which the FP8 route (activation quantization included) beat
    both W4 routes patch 04 can take (Marlin, dequantize + bf16 GEMM) at every larger measured M; NEVER when it
    lost at the largest M. Several shapes of one class take the largest. Rows without the three times are skipped."""
    per_shape: Dict[Tuple[str, int, str], list] = {}
    for r in rows:
        if r.get("bits") in (4, 8) and r.get("fp8_us") is not None and r.get("marlin_us") is not None:
            per_shape.setdefault((r["class"], r["bits"], r["shape"]), []).append(r)
    out: Dict[Tuple[str, int], int] = {}
    for (cls, bits, _), rs in per_shape.items():
        thr = NEVER
        for r in sorted(rs, key=lambda r: r["M"], reverse=True):
            w4 = min(v for v in (r.get("marlin_us"), r.get("dequant_us")) if v is not None)
            if r["fp8_us"] < w4:
                thr = r["M"]
            else:
                break
        out[(cls, bits)] = max(out.get((cls, bits), 0), thr)
    return out


def fp8_spec(thresholds: Dict[Tuple[str, int], int], kept_off: Iterable[str] = FP8_KEPT_OFF) -> str:
    """The SOARPACK_FP8_PREFILL text for these thresholds: NEVER and the `kept_off` classes as "off"."""
    kept = set(kept_off)
    return ",".join(f"{cls}:{bits}={'off' if m >= NEVER or cls in kept else m}"
                    for (cls, bits), m in sorted(thresholds.items()))
