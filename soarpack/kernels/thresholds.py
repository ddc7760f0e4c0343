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
