"""`soarpack eval` / `soarpack.eval()` and `soarpack bench` / `soarpack.bench()`: their requests, declared once
(soarpack.request derives the commands' options, the API's signatures and help, and the README's rows). The bounds
are the library's (check_eval_config, check_bench_config): one validator for the command and the API."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from soarpack.facts import limits
from soarpack.request import LoosePath, Option, PathList, Request

API_HELP = "Server address with its scheme, e.g. http://127.0.0.1:30000."
LABEL_HELP = "What is measured, in your words (e.g. 'w4-mlp seed 1'); recorded in the result."
BUNDLE_HELP = "The bundle the server's checkpoint came from: its id, sha256, profile and recipe are recorded."
TRUST_HELP = ("Run the tokenizer's own code from --model-dir (tokenization_*.py), as the platform's bench_serving "
              "does; only for a folder you trust. Off: its files are read as data.")


class EvalRequest(Request):
    api_base: str = Option(..., "--api-base", metavar="URL", help=API_HELP)
    data: LoosePath = Option(..., "--data", metavar="FILE",
                             help="JSONL with {task, question, gold} per line (perf_public_set.jsonl).")
    model_dir: Optional[LoosePath] = Option(None, "--model-dir", metavar="DIR", renamed_from=("model_path",),
                                            old_flags=("--model-path",),
                                            help="Served model dir: stop strings come from its generation config "
                                                 "and tokenizer, as on the platform.")
    trust_remote_code: bool = Option(False, "--trust-remote-code", help=TRUST_HELP)
    concurrency: int = Option(32, "--concurrency", metavar="N", help="Requests in flight at most.")
    rows: Optional[int] = Option(None, "-n", "--rows", metavar="N", renamed_from=("num_samples",),
                                 old_flags=("--num-samples",), help="Only the first N rows.")
    timeout: float = Option(limits.EVAL_TIMEOUT_S, "--timeout", metavar="SECONDS", renamed_from=("timeout_s",),
                            help="Per-request timeout (> 0); a timeout scores 0.")
    stall_timeout: float = Option(60.0, "--stall-timeout", metavar="SECONDS", renamed_from=("stall_s",),
                                  help="Fail a request whose reply has started but then sends no byte for this long "
                                       "(waiting for it to start is bounded by --timeout).")
    deadline: Optional[float] = Option(None, "--deadline", metavar="SECONDS", renamed_from=("deadline_s",),
                                       help="Fail a request not answered in full within this long, however its "
                                            "bytes trickle in. Off by default, as on the platform (whose timeout is "
                                            "per read, like --timeout).")
    retries: int = Option(0, "--retries", metavar="N",
                          help="Send a failed request again up to N times (the platform does not retry: a failed "
                               "row scores 0). The report gives the accuracy with and without.")
    max_tokens: int = Option(limits.EVAL_MAX_TOKENS, "--max-tokens", metavar="N",
                             help=f"max_tokens per request, at least 1 (the platform sends {limits.EVAL_MAX_TOKENS}).")
    output: Optional[LoosePath] = Option(None, "-o", "--output", metavar="FILE", cli_default=Path("eval.json"),
                                         help="Result JSON. An existing one is resumed only if it was measured "
                                              "against the same --api-base and model, from the same data.")
    resume: bool = Option(False, "--resume",
                          help="Resume OUTPUT although its server or model differ (e.g. the same checkpoint on "
                               "another port); the file lists both servers. Rows asked of another model id are sent "
                               "again.")
    force: bool = Option(False, "--force", help="Start OUTPUT over; the old file is kept beside as NAME.old-N.json.")
    label: Optional[str] = Option(None, "--label", metavar="TEXT", help=LABEL_HELP)
    bundle: Optional[LoosePath] = Option(None, "--bundle", metavar="TARBALL", help=BUNDLE_HELP)

    def to_config(self):
        from soarpack.measure.evaluate import EvalConfig

        return EvalConfig(api_base=self.api_base, data=self.data, output=self.output, model_dir=self.model_dir,
                          trust_remote_code=self.trust_remote_code, concurrency=self.concurrency, rows=self.rows,
                          timeout_s=self.timeout, max_tokens=self.max_tokens, stall_s=self.stall_timeout,
                          deadline_s=self.deadline, retries=self.retries, resume=self.resume, force=self.force,
                          label=self.label)


class BenchRequest(Request):
    api_base: str = Option(..., "--api-base", metavar="URL", help=API_HELP)
    s1: Optional[LoosePath] = Option(None, "--s1", metavar="FILE",
                                     help="Speed JSONL for S1 (concurrency 1); tier skipped if absent.")
    s8: Optional[LoosePath] = Option(None, "--s8", metavar="FILE", help="Speed JSONL for S8 (concurrency 8).")
    smax: Optional[LoosePath] = Option(None, "--smax", metavar="FILE", help="Speed JSONL for Smax (no cap).")
    model_dir: Optional[LoosePath] = Option(None, "--model-dir", metavar="DIR",
                                            renamed_from=("tokenizer_dir", "tokenizer"), old_flags=("--tokenizer",),
                                            help="Served model dir whose tokenizer counts max_new_tokens. [required]")
    trust_remote_code: bool = Option(False, "--trust-remote-code", help=TRUST_HELP)
    output: Optional[LoosePath] = Option(None, "-o", "--output", metavar="FILE", cli_default=Path("bench.json"),
                                         help="Result JSON (what score and compare read).")
    seed: int = Option(1, "--seed", metavar="N", help="Shuffle seed (the platform uses 1).")
    rows: Optional[int] = Option(None, "-n", "--rows", metavar="N", renamed_from=("num_prompts",),
                                 old_flags=("--num-prompts",), help="Only the first N rows after shuffling.")
    warmup: bool = Option(True, "--warmup/--no-warmup", help="One warm-up request per tier, as the platform.")
    flush: bool = Option(True, "--flush/--no-flush", renamed_from=("flush_cache",),
                         help="POST /flush_cache before each tier, as the platform.")
    settle: float = Option(1.0, "--settle", metavar="SECONDS", renamed_from=("settle_s",),
                           help="Wait after the flush before timing (bench_serving waits 1).")
    stall_timeout: float = Option(600.0, "--stall-timeout", metavar="SECONDS", renamed_from=("stall_s",),
                                  help="Fail a request whose stream sends no byte for this long.")
    deadline: float = Option(6 * 60 * 60, "--deadline", metavar="SECONDS", renamed_from=("deadline_s",),
                             help="Fail a request not finished within this long (bench_serving's total timeout per "
                                  "request: 6 h).")
    label: Optional[str] = Option(None, "--label", metavar="TEXT", help=LABEL_HELP)
    bundle: Optional[LoosePath] = Option(None, "--bundle", metavar="TARBALL", help=BUNDLE_HELP)

    def to_config(self):
        from soarpack.measure.speed import BenchConfig

        tiers = {name: path for name, path in (("s1", self.s1), ("s8", self.s8), ("smax", self.smax)) if path}
        return BenchConfig(api_base=self.api_base, tiers=tiers, model_dir=self.model_dir,
                           trust_remote_code=self.trust_remote_code, output=self.output, seed=self.seed,
                           rows=self.rows, warmup=self.warmup, flush_cache=self.flush, settle_s=self.settle,
                           stall_s=self.stall_timeout, deadline_s=self.deadline, label=self.label)


class ScoreRequest(Request):
    ours: LoosePath = Option(..., "--ours", metavar="FILE", help="Our bench JSON (soarpack bench -o).")
    eval: Optional[LoosePath] = Option(None, "--eval", metavar="FILE",
                                       help="Our eval JSON; without it C = 1 is assumed.")
    best: Optional[LoosePath] = Option(None, "--best", metavar="FILE",
                                       help="A bench JSON whose durations count as the best (e.g. a run of your own, "
                                            "to compare against it).")
    best_s1: Optional[float] = Option(None, "--best-s1", metavar="SECONDS",
                                      help="Best S1 duration, from the leaderboard (overrides --best).")
    best_s8: Optional[float] = Option(None, "--best-s8", metavar="SECONDS", help="Best S8 duration.")
    best_smax: Optional[float] = Option(None, "--best-smax", metavar="SECONDS", help="Best Smax duration.")

    def best_given(self) -> dict:
        return {t: v for t, v in (("s1", self.best_s1), ("s8", self.best_s8), ("smax", self.best_smax)) if v is not None}


class CompareRequest(Request):
    results: PathList = Option(..., argument=True, metavar="RESULTS",
                               help="JSON files of soarpack eval and bench (grouped as above).")
    chart: Optional[LoosePath] = Option(None, "--chart", metavar="PNG",
                                        help="Also draw bench tiers and accuracy per task (needs the plot extra).")
    best_s1: Optional[float] = Option(None, "--best-s1", metavar="SECONDS",
                                      help="Best S1 time (default: the fastest compared run's).")
    best_s8: Optional[float] = Option(None, "--best-s8", metavar="SECONDS", help="Best S8 time.")
    best_smax: Optional[float] = Option(None, "--best-smax", metavar="SECONDS", help="Best Smax time.")

    def best_given(self) -> dict:
        return {t: v for t, v in (("s1", self.best_s1), ("s8", self.best_s8), ("smax", self.best_smax)) if v is not None}
