"""A synthetic slice in the public set's format ({task, question, gold} per line) for `rehearse-server` on the device.

    python benchmarks/gpu_serve/public_slice.py --out slice.jsonl [--per-task 2] [--haystack-words 1500]

The real public set is the user's (perf_public_set.jsonl) and not in this repo. These rows exercise what the
rehearsal runs, every task the scorer knows (mcq, niah, qa, lcx, cwe, fwe), a long needle-in-a-haystack prompt and
short ones; on random weights their accuracy is 0 by construction and says nothing about a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from soarpack.measure.speedset import BUILTIN_TEXT  # noqa: E402

TASKS = ("mcq", "niah", "qa", "lcx", "cwe", "fwe")


def haystack(words: int, rng: random.Random) -> list:
    pool = BUILTIN_TEXT.split()
    start = rng.randrange(len(pool))
    return [pool[(start + i) % len(pool)] for i in range(words)]


def row(task: str, k: int, words: int, rng: random.Random) -> dict:
    if task == "mcq":
        q = (f"Question {k}: which harbour object was inspected by the mayor?\nA. the lighthouse\nB. the harbour wall\n"
             "C. the ferry\nD. the bridge\nAnswer with ANSWER: followed by the letter.")
        return {"task": task, "question": q, "gold": "B"}
    if task == "niah":
        text = haystack(words, rng)
        needle = f"The secret code of record {k} is {rng.randrange(10**6):06d}."
        text.insert(rng.randrange(len(text)), needle)
        return {"task": task, "question": " ".join(text) + f"\nWhat is the secret code of record {k}?",
                "gold": [needle.split()[-1].rstrip(".")]}
    if task in ("qa", "lcx"):
        text = " ".join(haystack(words // 3, rng))
        return {"task": task, "question": text + "\nWhich bird nested below the seventh lamp?", "gold": ["heron"]}
    words_list = [f"word{rng.randrange(50)}" for _ in range(words // 5)]
    return {"task": task, "question": " ".join(words_list) + "\nList the most frequent words.",
            "gold": sorted(set(words_list))[:3]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-task", type=int, default=2)
    ap.add_argument("--haystack-words", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    rows = [row(t, k, a.haystack_words, rng) for k in range(a.per_task) for t in TASKS]
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(json.dumps({"slice": a.out, "rows": len(rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
