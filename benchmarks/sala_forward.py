"""soarpack.sala speed and memory on this machine: chunked vs recurrent GLA, and the peak memory of loading.

    python benchmarks/sala_forward.py [--tokens 2048] [--threads 2]

Prints one table. Rows:
- GLA chunked / recurrent (tokens/s) at the tiny model's heads and at a full-size Lightning layer's (32 × 128),
  in float32 on the CPU, same inputs, side by side;
- whole-layer forward (tokens/s) of one full-size sparse and one full-size Lightning layer, bf16;
- loading (peak RSS growth with every weight page touched, in a fresh process) of the tiny model and of a 2-layer full-width checkpoint
  (embeddings and lm_head at the real vocab), against the checkpoint's size on disk.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from soarpack.sala import gla
from soarpack.sala.config import SalaConfig, alibi_slopes
from soarpack.sala.model import SalaDecoderLayer
from soarpack.sala.release import release_config_dict


def timed(fn, repeat: int = 2) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def gla_rows(tokens: int) -> list[tuple[str, str, str]]:
    rows = []
    for label, heads in (("tiny (2 heads)", 2), ("full layer (32 heads)", 32)):
        q, k, v = (torch.randn(1, tokens, heads, 128) for _ in range(3))
        g = -torch.tensor(alibi_slopes(heads))
        chunk = timed(lambda: gla.chunk_gla(q, k, v, g, 128**-0.5))
        n_rec = min(tokens, 512)  # the recurrent form is per token: time a prefix, report per-token rate
        rec = timed(lambda: gla.recurrent_gla(q[:, :n_rec], k[:, :n_rec], v[:, :n_rec], g, 128**-0.5), repeat=1)
        rows.append((f"GLA chunked, {label}, T={tokens}", f"{tokens / chunk:,.0f} tok/s", ""))
        rows.append((f"GLA recurrent, {label}, T={n_rec}", f"{n_rec / rec:,.0f} tok/s", f"chunked is {(tokens / chunk) / (n_rec / rec):.1f}× faster"))
    return rows


def layer_rows(tokens: int) -> list[tuple[str, str, str]]:
    cfg = SalaConfig.from_dict(release_config_dict())
    rows = []
    for idx, label in ((0, "sparse (minicpm4)"), (1, "lightning")):
        layer = SalaDecoderLayer(cfg, idx).to(torch.bfloat16).eval()
        x = torch.randn(1, tokens, cfg.hidden_size, dtype=torch.bfloat16)
        with torch.no_grad():
            t = timed(lambda: layer(x), repeat=1)
        rows.append((f"full-size {label} layer forward, bf16, T={tokens}", f"{tokens / t:,.0f} tok/s", ""))
    return rows


# VmHWM, not ru_maxrss: a child started by a large parent inherits the parent's ru_maxrss across exec.
LOAD_SNIPPET = """
import sys, json, torch
from soarpack.sala.checkpoint import load_model
def hwm_kib():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
before = hwm_kib()
m = load_model(sys.argv[1], dtype=torch.bfloat16)
for p in m.parameters():  # touch every page: mmapped tensors are not resident until read
    p.detach().view(-1)[::1024].float().sum()
after = hwm_kib()
params = sum(p.numel() * p.element_size() for p in m.parameters())
print(json.dumps({"peak_kib": after - before, "param_bytes": params}))
"""


def load_rows(workdir: Path) -> list[tuple[str, str, str]]:
    from soarpack.sala.checkpoint import save_state_dict
    from soarpack.sala.tiny import make_tiny_model, random_weights

    tiny = make_tiny_model(workdir / "tiny")
    wide = workdir / "wide"
    raw = release_config_dict()
    raw.update(num_hidden_layers=2, mixer_types=["minicpm4", "lightning-attn"])
    wide.mkdir()
    (wide / "config.json").write_text(json.dumps(raw))
    save_state_dict(random_weights(SalaConfig.from_dict(raw), seed=0), wide, max_shard_bytes=1 << 30)
    rows = []
    for label, path in (("tiny model", tiny), ("2 full-width layers + real vocab", wide)):
        disk = sum(p.stat().st_size for p in path.glob("*.safetensors"))
        out = subprocess.run([sys.executable, "-c", LOAD_SNIPPET, str(path)], capture_output=True, text=True, check=True)
        stats = json.loads(out.stdout.strip().splitlines()[-1])
        peak = stats["peak_kib"] * 1024
        rows.append((f"load {label} (bf16)", f"peak RSS +{peak / 2**20:,.0f} MiB", f"weights {stats['param_bytes'] / 2**20:,.0f} MiB, disk {disk / 2**20:,.0f} MiB, ratio {peak / stats['param_bytes']:.2f}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gla.set_backend("torch")
    rows = gla_rows(args.tokens) + layer_rows(args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        rows += load_rows(Path(tmp))
    table = Table(title=f"soarpack.sala on {torch.get_num_threads()} CPU threads (torch {torch.__version__})")
    for col in ("what", "result", "note"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
