"""Correct, not only alive: the fork server's first 16 greedy tokens against soarpack's own SALA forward.

On the device, in this order (each step its own process; `reference` and `w4` need torch + this repo on
PYTHONPATH, `query` and `table` only the standard library):

    python compare.py build --out /tmp/m/bf16                 # 2 layers (sparse, lightning), full width, random bf16
    python compare.py w4 --src /tmp/m/bf16 --out /tmp/m/w4    # w4-mlp: the MLP linears as GPTQ v1 W4 g128 sym (RTN)
    python compare.py reference --ckpt /tmp/m/bf16 --out ref-bf16.json [--device cuda]
    python compare.py query --ckpt /tmp/m/bf16 --url http://127.0.0.1:30000 --out served-bf16.json
    python compare.py table --ref ref-bf16.json --served served-bf16.json --need 16   # exit 1 below the bar

- Prompts: PROMPTS below, tokenized with the checkpoint's tokenizer.json once (`query` sends `input_ids`, so the
  server and the reference see the same ids); all far below the config's dense_len.
- The reference is `SalaForCausalLM.greedy` (soarpack/sala/model.py) in bf16; for a GPTQ checkpoint on the weights
  as gptq_marlin reads them (`load_dequantized(..., marlin=True)`: W = (q - 8) * s).
- The server is asked for temperature 0, 16 new tokens, ignore_eos, and its token ids (output_ids, or the
  logprob records' ids when the server does not return output_ids).
- `table` prints one row per prompt: tokens equal at the same position, the first position that differs, and
  the reference's top-1 margin there (logit gap to the runner-up: a flip at a margin of ~1e-2 is bf16 rounding
  between kernels, a flip at a wide margin is a bug). Bars: bf16 16/16 on every prompt, w4-mlp >= 15/16.
- The W4 checkpoint is written here by round-to-nearest in soarpack's GPTQ v1 layout with soarpack's own
  quantization_config (recipe w4-mlp), not by `soarpack quantize` (GPTQModel and transformers 5 would be a second
  carried stack): the comparison is server vs the dequantized weights, which any valid GPTQ tensors test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ", "1, 2, 3, 4, 5,")
NEW_TOKENS = 16
# The tiny model's remote-code config module refuses to import (soarpack.sala.tiny); the fork replaces whatever
# class it gives by MiniCPMHybridConfig, so a plain PretrainedConfig subclass serves (as soarpack serve-check does).
STANDIN_REMOTE_CONFIG = (
    "from transformers import PretrainedConfig\n\n\n"
    "class {cls}(PretrainedConfig):\n"
    "    model_type = \"minicpm_sala\"\n"
)


def _sys_path():
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))


def write_servable_config_module(ckpt: Path) -> None:
    raw = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    target = (raw.get("auto_map") or {}).get("AutoConfig")
    if target:
        module, _, cls = target.partition(".")
        (ckpt / f"{module}.py").write_text(STANDIN_REMOTE_CONFIG.format(cls=cls), encoding="utf-8")


def pad_tokenizer_to_vocab(ckpt: Path) -> int:
    """Give every id below config.json's vocab_size a token (" w<id>", unreachable by encoding): the random model
    emits any id, and the server streams text only for ids its detokenizer knows (bench_serving and soarpack bench
    time a stream by its chunks that carry text). Returns the tokens added."""
    vocab_size = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    path = ckpt / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in tok.get("added_tokens", [])}
    added = 0
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"\u0120w{i}"] = i  # byte-level: \u0120 decodes to a space
            added += 1
    path.write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return added


def cmd_build(a) -> int:
    _sys_path()
    from gpu_quantize import build_model

    work = Path(a.out).parent
    built = build_model(work, a.layers, a.device, a.shape, seed=a.seed)
    out = Path(a.out)
    if built != out:
        if out.exists():
            shutil.rmtree(out)
        built.rename(out)
    write_servable_config_module(out)
    padded = pad_tokenizer_to_vocab(out)
    print(json.dumps({"built": str(out), "layers": a.layers, "shape": a.shape, "tokens_added": padded}))
    return 0


def rtn_gptq(weight, group_size: int = 128, bits: int = 4, device: str = "cpu"):
    """GPTQ v1 tensors of `weight` [out, in] by round-to-nearest, symmetric (stored zero 2^(b-1) - 1); CPU tensors."""
    import torch

    from soarpack.quant.gptq_format import pack_cols, pack_rows

    w = weight.to(device=device, dtype=torch.float32)
    out_f, in_f = w.shape
    groups = in_f // group_size
    half = 1 << (bits - 1)
    wg = w.view(out_f, groups, group_size)
    scales = (wg.abs().amax(-1) / (half - 1)).clamp(min=1e-8)  # [out, groups]
    scales = scales.to(torch.float16).to(torch.float32)
    q = torch.clamp(torch.round(wg / scales.unsqueeze(-1)) + half, 0, (1 << bits) - 1).to(torch.int32)
    q = q.view(out_f, in_f)
    return {
        "qweight": pack_rows(q.t().contiguous(), bits).cpu(),
        "qzeros": pack_cols(torch.full((groups, out_f), half - 1, dtype=torch.int32), bits),
        "scales": scales.t().contiguous().to(torch.float16).cpu(),
        "g_idx": (torch.arange(in_f, dtype=torch.int32) // group_size),
    }


def cmd_w4(a) -> int:
    _sys_path()
    from soarpack import __version__
    from soarpack.quant.finalize import copy_side_files, write_config
    from soarpack.recipe.checkpoint import quantization_config
    from soarpack.recipe.model import load_recipe
    from soarpack.sala.checkpoint import read_state_dict, save_state_dict
    from soarpack.sala.config import load_config

    src, out = Path(a.src), Path(a.out)
    recipe = load_recipe(a.recipe)
    config = load_config(src)
    plan = recipe.plan(config)
    state = read_state_dict(src)
    tensors, quantized = {}, 0
    for name, tensor in state.items():
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        mq = plan.get(module) if module else None
        if mq is None:
            tensors[name] = tensor
            continue
        for part, value in rtn_gptq(tensor, mq.group_size, mq.bits, a.device).items():
            tensors[f"{module}.{part}"] = value
        quantized += 1
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_state_dict(tensors, out, max_shard_bytes=2 << 30)
    copy_side_files(src, out)
    write_config(src, out, quantization_config(recipe, config, [f"soarpack:{__version__} (round-to-nearest, benchmarks/gpu_serve)"]))
    write_servable_config_module(out)
    print(json.dumps({"w4": str(out), "recipe": recipe.name, "quantized_linears": quantized}))
    return 0


def prompt_ids(ckpt: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    return [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]


def cmd_reference(a) -> int:
    _sys_path()
    import torch

    ckpt = Path(a.ckpt)
    raw = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    quantized = isinstance(raw.get("quantization_config"), dict)
    if quantized:
        from soarpack.quant.dequantize import load_dequantized

        model = load_dequantized(ckpt, dtype=torch.bfloat16, device=a.device, marlin=True)
    else:
        from soarpack.sala.checkpoint import load_model

        model = load_model(ckpt, dtype=torch.bfloat16, device=a.device)
    model = model.to(device=a.device).eval()  # not .to(dtype): the Lightning decay buffers stay float64
    if a.follow:
        served = json.loads(Path(a.follow).read_text(encoding="utf-8"))["rows"]
    rows = []
    with torch.no_grad():
        for i, ids in enumerate(prompt_ids(ckpt)):
            if not a.follow:
                steps = decode(model, ids, a.device, a.new_tokens)
                rows.append({"input_ids": ids, "tokens": [s[0] for s in steps], "margins": [s[1] for s in steps]})
                continue
            if served[i]["input_ids"] != ids:
                raise SystemExit("error: the served file was asked with other input ids than this checkpoint's prompts")
            steps = decode(model, ids, a.device, len(served[i]["tokens"]), forced=served[i]["tokens"])
            rows.append({"input_ids": ids, "served": served[i]["tokens"], "ref_argmax": [s[0] for s in steps],
                         "margins": [s[1] for s in steps], "deficits": [s[2] for s in steps]})
    what = "fed the served tokens" if a.follow else "greedy"
    result = {"ckpt": str(ckpt), "quantized": quantized, "reference": f"soarpack SalaForCausalLM {what}, bf16",
              "device": a.device, "rows": rows}
    Path(a.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps({"followed" if a.follow else "reference": a.out, "prompts": len(rows)}))
    return 0


def decode(model, ids, device, steps: int, forced=None):
    """[(argmax, top-1 margin, deficit of the token taken)] per position: greedy, or fed `forced` (teacher forcing).

    Fed the server's tokens, every position is judged (is the served token at the reference's maximum logit, ties
    included?): a free-running comparison cannot judge anything after the first flip at a tie, since the two then
    continue from different prefixes. Greedy, the deficit is 0 and the margin 0 means a bf16 tie."""
    import torch

    cache = model.new_cache()
    logits = model(torch.tensor([ids], device=device), cache=cache)
    out = []
    for k in range(steps):
        last = logits[0, -1].float()
        top = torch.topk(last, 2).values
        best = int(last.argmax())  # the first of equal maxima, as SalaForCausalLM.greedy and torch.argmax pick
        tok = best if forced is None else int(forced[k])
        out.append((best, float(top[0] - top[1]), float(top[0] - last[tok])))
        logits = model(torch.tensor([[tok]], device=device), cache=cache)
    return out


def served_tokens(response: dict) -> list:
    if isinstance(response.get("output_ids"), list):
        return [int(t) for t in response["output_ids"]]
    records = (response.get("meta_info") or {}).get("output_token_logprobs") or []
    return [int(r[1]) for r in records]


def post(url: str, payload: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def _alive(pid) -> bool:
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0): read its state (Linux).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def wait_ready(base: str, deadline_s: float, pid=None) -> float:
    """Seconds until /health answers 200; stops early when the server process `pid` has died (saves device time)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if not _alive(pid):
            raise SystemExit(f"error: the server process {pid} exited before {base}/health answered "
                             f"({time.monotonic() - t0:.0f} s)")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"error: the server at {base} did not answer /health in {deadline_s:.0f} s")


def cmd_wait(a) -> int:
    print(json.dumps({"healthy_after_s": round(wait_ready(a.url.rstrip("/"), a.wait, a.pid), 1)}))
    return 0


def cmd_query(a) -> int:
    base = a.url.rstrip("/")
    waited = wait_ready(base, a.wait, a.pid)
    rows = []
    for ids in prompt_ids(Path(a.ckpt)):
        payload = {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 0,
                   "sampling_params": {"temperature": 0.0, "max_new_tokens": a.new_tokens, "ignore_eos": True}}
        response = post(base + "/generate", payload, a.timeout)
        rows.append({"input_ids": ids, "tokens": served_tokens(response), "text": response.get("text")})
    Path(a.out).write_text(json.dumps({"url": base, "waited_s": round(waited, 1), "rows": rows}, indent=1))
    print(json.dumps({"served": a.out, "prompts": len(rows)}))
    return 0


def compare_rows(ref: dict, served: dict, need: int):
    """[(prompt, equal, first_diff, margin_at_diff, ok)] and the verdict."""
    out = []
    for i, (r, s) in enumerate(zip(ref["rows"], served["rows"])):
        if r["input_ids"] != s["input_ids"]:
            raise SystemExit(f"error: prompt {i}: the reference and the server saw different input ids")
        want, got = r["tokens"], s["tokens"]
        equal = sum(1 for x, y in zip(want, got) if x == y)
        diff = next((k for k, (x, y) in enumerate(zip(want, got)) if x != y), None)
        if diff is None and len(got) < len(want):
            diff = len(got)
        margin = r["margins"][diff] if diff is not None and diff < len(r["margins"]) else None
        out.append((i, equal, diff, margin, equal >= need and len(got) == len(want)))
    ok = len(out) == len(ref["rows"]) == len(served["rows"]) and all(row[-1] for row in out)
    return out, ok


def followed_rows(followed: dict, need: int):
    """[(prompt, greedy choices/16, exact argmax/16, worst deficit, ok)]: the bar is on greedy choices (ties count)."""
    out = []
    for i, r in enumerate(followed["rows"]):
        greedy = sum(1 for d in r["deficits"] if d == 0.0)
        exact = sum(1 for t, m in zip(r["served"], r["ref_argmax"]) if t == m)
        worst = max(r["deficits"]) if r["deficits"] else None
        out.append((i, greedy, exact, worst, greedy >= need and len(r["served"]) == NEW_TOKENS))
    return out, bool(out) and all(row[-1] for row in out)


def render_followed(rows, need: int, n: int) -> str:
    lines = [f"prompt | served token at the reference's max logit (ties count)/{n} | = reference argmax/{n} | "
             f"largest logit deficit of a served token | >= {need}", "---|---|---|---|---"]
    for i, greedy, exact, worst, ok in rows:
        lines.append(f"{i} {PROMPTS[i]!r} | {greedy}/{n} | {exact}/{n} | "
                     f"{'-' if worst is None else f'{worst:.4f}'} | {'ok' if ok else 'FAIL'}")
    return "\n".join(lines)


def render(rows, need: int, n: int) -> str:
    lines = [f"prompt | equal/{n} | first diff | ref top-1 margin there | >= {need}", "---|---|---|---|---"]
    for i, equal, diff, margin, ok in rows:
        lines.append(f"{i} {PROMPTS[i]!r} | {equal}/{n} | {'-' if diff is None else diff} | "
                     f"{'-' if margin is None else f'{margin:.4f}'} | {'ok' if ok else 'FAIL'}")
    return "\n".join(lines)


def cmd_table(a) -> int:
    ref = json.loads(Path(a.ref).read_text(encoding="utf-8"))
    served = json.loads(Path(a.served).read_text(encoding="utf-8"))
    rows, ok = compare_rows(ref, served, a.need)
    kind = "w4" if ref.get("quantized") else "bf16"
    print("free-running: the reference's own greedy tokens against the server's, position by position")
    print(render(rows, a.need, NEW_TOKENS))
    print(("PASS" if ok else "FAIL") + f": {sum(r[-1] for r in rows)}/{len(ref['rows'])} prompts with >= {a.need} "
          f"of {NEW_TOKENS} tokens equal ({kind} checkpoint)")
    if not a.followed:
        return 0 if ok else 1
    frows, fok = followed_rows(json.loads(Path(a.followed).read_text(encoding="utf-8")), a.need)
    print("\nfollowed: the reference fed the server's tokens; a served token is correct when it is at the reference's "
          "maximum logit (a bf16 tie has two right answers)")
    print(render_followed(frows, a.need, NEW_TOKENS))
    print(("PASS" if fok else "FAIL") + f": {sum(r[-1] for r in frows)}/{len(frows)} prompts with >= {a.need} of "
          f"{NEW_TOKENS} served tokens a greedy choice of the reference ({kind} checkpoint)")
    return 0 if fok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", required=True)
    b.add_argument("--layers", type=int, default=2)
    b.add_argument("--shape", choices=("full", "tiny"), default="full")
    b.add_argument("--device", default="cpu")
    b.add_argument("--seed", type=int, default=0)
    w = sub.add_parser("w4")
    w.add_argument("--src", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--recipe", default="w4-mlp")
    w.add_argument("--device", default="cpu", help="where the rounding runs (the tensors are packed on the CPU)")
    r = sub.add_parser("reference")
    r.add_argument("--ckpt", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    r.add_argument("--follow", help="a served JSON (query's --out): feed its tokens instead of the reference's own")
    q = sub.add_parser("query")
    q.add_argument("--ckpt", required=True)
    q.add_argument("--url", default="http://127.0.0.1:30000")
    q.add_argument("--out", required=True)
    q.add_argument("--wait", type=float, default=300)
    q.add_argument("--pid", type=int, help="the server's process id: stop waiting when it has exited")
    q.add_argument("--timeout", type=float, default=120)
    q.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    wt = sub.add_parser("wait", help="until the server's /health answers (or its process has died)")
    wt.add_argument("--url", default="http://127.0.0.1:30000")
    wt.add_argument("--wait", type=float, default=300)
    wt.add_argument("--pid", type=int)
    t = sub.add_parser("table")
    t.add_argument("--ref", required=True)
    t.add_argument("--served", required=True)
    t.add_argument("--need", type=int, default=NEW_TOKENS)
    t.add_argument("--followed", help="reference --follow's JSON: judge every served token (the bar then applies here)")
    a = ap.parse_args(argv)
    return {"build": cmd_build, "w4": cmd_w4, "reference": cmd_reference, "query": cmd_query, "wait": cmd_wait,
            "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
