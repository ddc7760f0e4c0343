"""How far apart are two written checkpoints? Tensor by tensor, down to the 4-bit codes.

    python benchmarks/compare_checkpoints.py A B [--json out.json]

Prints one table: tensors compared and bitwise identical; for the packed `qweight`s, the share of 4-bit codes that
differ and the largest difference in quantization steps; for `scales`, the largest relative difference; for every
other tensor, whether it is identical. Exit 0 whatever it finds: this measures, it does not judge.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from soarpack.sala.checkpoint import iter_tensors

SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def codes(packed: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes of a GPTQ int32 tensor (8 per int32), as small ints."""
    return (packed.unsqueeze(-1) >> SHIFTS) & 0xF


def compare(a_dir: Path, b_dir: Path) -> dict:
    a = dict(iter_tensors(a_dir))
    b = dict(iter_tensors(b_dir))
    only = sorted(a.keys() ^ b.keys())
    stats = {"tensors": len(a.keys() & b.keys()), "only_in_one": only, "identical": 0, "differ": [],
             "codes": 0, "codes_differ": 0, "max_code_step": 0, "scales_max_rel_diff": 0.0}
    for name in sorted(a.keys() & b.keys()):
        x, y = a[name], b[name]
        same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        stats["identical"] += same
        if not same:
            stats["differ"].append(name)
        if name.endswith(".qweight") and x.shape == y.shape:
            cx, cy = codes(x), codes(y)
            stats["codes"] += cx.numel()
            stats["codes_differ"] += int((cx != cy).sum())
            stats["max_code_step"] = max(stats["max_code_step"], int((cx - cy).abs().max()))
        elif name.endswith(".scales") and x.shape == y.shape:
            rel = ((x.float() - y.float()).abs() / y.float().abs().clamp(min=1e-12)).max()
            stats["scales_max_rel_diff"] = max(stats["scales_max_rel_diff"], float(rel))
    stats["codes_differ_share"] = stats["codes_differ"] / max(stats["codes"], 1)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    s = compare(args.a, args.b)
    print(f"| {args.a.name} vs {args.b.name} | tensors | identical | 4-bit codes differing | largest step "
          f"| scales max rel diff |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| | {s['tensors']} | {s['identical']} | {s['codes_differ']:,} of {s['codes']:,} "
          f"({s['codes_differ_share']:.2e}) | {s['max_code_step']} | {s['scales_max_rel_diff']:.2e} |")
    if s["only_in_one"]:
        print(f"tensors in only one of them: {s['only_in_one'][:5]}")
    if args.json:
        args.json.write_text(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
