"""A stand-in for benchmarks/gpu_serve/launch.py in ruler_lease.sh's CPU rehearsal (tests/test_ruler_lease.py).

It takes launch.py's command line (`--model-path --port --fork-src --site [--marlin-so X] [--bf16] -- EXTRA...`),
parsed by launch.py's own parser and refused where launch.py refuses it (a W4 checkpoint without --marlin-so), and
also refuses what would fail on the device later: a checkpoint without a tokenizer, a fork tree without sglang/, a
--marlin-so that is not a file. It appends what it was given, the server command line launch.py would run and its
pid (the server's process group: lib.sh starts it with setsid) as one JSON line to $RULER_STANDIN_RECORD, then
becomes `soarpack fake-server` on that port (as launch.py becomes the server, so that the script's kill of the process
group stops it). The fake server reports the checkpoint as its model id, so the organisers' client loads the
tokenizer from it as it would from the fork's server.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu_serve"))

import launch  # noqa: E402

TTFT_S = os.environ.get("RULER_STANDIN_TTFT", "0.01")
TOKEN_DELAY_S = os.environ.get("RULER_STANDIN_TOKEN_DELAY", "0.0005")


def refusal(a) -> str | None:
    if not a.bf16 and not a.marlin_so:
        return "a W4 checkpoint needs --marlin-so (launch.py refuses it too)"
    if not (Path(a.model_path) / "tokenizer.json").is_file():
        return f"no tokenizer.json in the checkpoint {a.model_path}"
    if not (Path(a.fork_src) / "sglang").is_dir():
        return f"no sglang/ in the fork tree {a.fork_src}"
    if a.marlin_so and not Path(a.marlin_so).is_file():
        return f"--marlin-so {a.marlin_so} is not a file"
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = launch.parse(argv)
    why = refusal(a)
    record = {"pid": os.getpid(), "argv": argv, "model_path": a.model_path, "fork_src": a.fork_src,
              "marlin_so": a.marlin_so, "bf16": a.bf16, "extra": a.extra, "refused": why,
              "gla_decode": os.environ.get("SOARPACK_GLA_DECODE"),  # patch 06's switch, as the server would read it
              "server_argv": launch.server_argv(a.model_path, a.port, launch.read_profile_args(a.profile), a.bf16,
                                                a.extra)}
    with open(os.environ["RULER_STANDIN_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "soarpack", "fake-server", "--port", str(a.port), "--model-id", a.model_path,
           "--ttft", TTFT_S, "--token-delay", TOKEN_DELAY_S]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print("stand-in launch: " + " ".join(cmd), flush=True)
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
