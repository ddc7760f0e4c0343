"""Load a quantized checkpoint through the OpenBMB SGLang fork's own code on a CPU: `soarpack serve-check`.

The fork's server args, `ModelConfig`, quantization-config detection, `MiniCPMSALAForCausalLM` and `load_weights`
run in a child interpreter (`_fork_child.py`), by default the image stand-in (the image's Python with the fork's
pins, soarpack.facts.image), with the fork's GPU-only extensions stood in. This module builds the request,
runs the child, and judges its report against the recipe's plan: each decoder linear must get the quant method and
bits the recipe says, every checkpoint tensor must land in a parameter, and every parameter must be written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from soarpack.errors import CheckpointError, ConfigError, SoarpackError
from soarpack.facts import gpu, launch
from soarpack.steps import EventCallback, no_events

CHILD_SCRIPT = Path(__file__).with_name("_fork_child.py")
CHILD_TIMEOUT_S = 900
QUANTIZED_METHOD = "GPTQMarlinLinearMethod"
UNQUANTIZED_METHOD = "UnquantizedLinearMethod"
# --quantization values that quantize a 16-bit checkpoint at load, and the quant method each 16-bit linear then has
ONLINE_METHODS = {"fp8": "Fp8LinearMethod"}
# Parameters a checkpoint may leave out: under --quantization fp8 every attention layer gets k_scale/v_scale, which
# the fork sets to 1.0 when the checkpoint has none (layers/quantization/kv_cache.py BaseKVCacheMethod).
OPTIONAL_PARAMS = (".attn.k_scale", ".attn.v_scale")


def unwritten_required(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The child's unwritten parameters, less those the fork fills itself when a checkpoint omits them."""
    return [u for u in report.get("unwritten", []) if not u["param"].endswith(OPTIONAL_PARAMS)]


class ForkCheckError(SoarpackError):
    """The fork check could not run (no interpreter, the child died without a report)."""


@dataclass
class ModuleRow:
    module: str  # the fork's (fused) module name
    method: Optional[str]
    bits: Optional[int]
    group_size: Optional[int]
    planned: str  # "16-bit" or "W4 g128"
    ok: bool


@dataclass
class ForkCheckResult:
    ok: bool
    summary: str  # one line
    table: str  # the per-module table and every problem, plain text
    problems: List[str] = field(default_factory=list)  # one line each
    rows: List[ModuleRow] = field(default_factory=list)
    report: Dict[str, Any] = field(default_factory=dict)  # the child's raw report
    log: Optional[str] = None  # the child's stdout+stderr, kept when the check fails
    recipe: Optional[str] = None  # the recipe's name it was judged against
    fork_commit: Optional[str] = None  # the fork commit the tree's touched files match

    def to_dict(self) -> Dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary, "problems": self.problems,
                "modules": [row.__dict__ for row in self.rows], "report": self.report}


# -- inputs ----------------------------------------------------------------------------------------------------


def _read_config(ckpt: Path, unquantized_ok: bool = False) -> Dict[str, Any]:
    if not (ckpt / "config.json").is_file():
        raise CheckpointError(f"{ckpt} has no config.json", "pass a checkpoint written by `soarpack quantize`")
    try:
        raw = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{ckpt}/config.json is not JSON: {exc}") from None
    if not isinstance(raw.get("quantization_config"), dict) and not unquantized_ok:
        raise CheckpointError(f"{ckpt}/config.json has no quantization_config",
                              "pass a quantized checkpoint (or, for an unquantized one, a recipe with method = \"none\")")
    return raw


def recipe_of(raw_config: Dict[str, Any], recipe=None):
    """The recipe to judge against: the one given, else the one the checkpoint carries (soarpack.recipe.checkpoint).
    An unquantized checkpoint carries none: it is judged against the given recipe (method "none")."""
    from soarpack.recipe.checkpoint import recipe_for
    from soarpack.recipe.model import load_recipe

    if not isinstance(raw_config.get("quantization_config"), dict):
        return load_recipe(recipe)
    return recipe_for(raw_config["quantization_config"], recipe)


def _quantizes_nothing(recipe) -> bool:
    if recipe is None:
        return False
    from soarpack.recipe.model import load_recipe

    return not load_recipe(recipe).quantizes


def online_method(server_args: Sequence[str]) -> str:
    """The quant method a 16-bit linear gets under these server args: the online method of --quantization fp8,
    else UnquantizedLinearMethod."""
    from soarpack.serve.serverargs import split_args

    args = split_args(list(server_args))
    quant = None
    for i, tok in enumerate(args):
        if tok == "--quantization" and i + 1 < len(args):
            quant = args[i + 1]
        elif tok.startswith("--quantization="):
            quant = tok.split("=", 1)[1]
    return ONLINE_METHODS.get(quant or "", UNQUANTIZED_METHOD)


def uses_placeholder_remote_config(ckpt: Path, raw_config: Dict[str, Any]) -> bool:
    """A tiny test checkpoint whose remote-code config module is soarpack's placeholder (it refuses to import)."""
    from soarpack.sala.tiny import REMOTE_CODE_PLACEHOLDER

    target = (raw_config.get("auto_map") or {}).get("AutoConfig")
    if not target:
        return False
    module = ckpt / (target.split(".", 1)[0] + ".py")
    marker = REMOTE_CODE_PLACEHOLDER.splitlines()[0]
    return module.is_file() and module.read_text(encoding="utf-8", errors="replace").startswith(marker)


def patched_files() -> List[str]:
    """Every fork file our patch set touches, relative to python/."""
    from soarpack.serve.patches import load_patches

    return list(dict.fromkeys(fd.path for p in load_patches() for fd in p.files))


def resolve_python(python: Optional[os.PathLike], dev_stack: bool, on_event: EventCallback = no_events) -> Path:
    """The child's interpreter: the one given, this one (--dev-stack), or the image stand-in (the default)."""
    if python is not None and dev_stack:
        raise ConfigError("--python and --dev-stack both name the interpreter", "pass one of them")
    if dev_stack:
        return Path(sys.executable)
    if python is not None:
        path = Path(python)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ConfigError(f"--python {path} is not an executable file", "pass a Python with torch and the fork's deps")
        return path
    from soarpack.imagestack import ensure_image_stack

    return ensure_image_stack(on_event=on_event).python


# -- running the child -----------------------------------------------------------------------------------------


def platform_request() -> Dict[str, Any]:
    """The platform's facts the child needs, from soarpack.facts (the child imports nothing of soarpack): the launch
    line around our server args and the GPU its stand-ins answer as."""
    leading = launch.leading_args("MODEL")
    # The metrics flag is left out: the check parses the args and builds the model, it starts no server.
    after = [a for a in launch.TRAILING_ARGS if a != launch.METRICS_FLAG]
    return {"launch": {"model_path_flag": leading[0], "before": leading[2:], "after": after}, "gpu": gpu.as_request()}


def child_command(python: os.PathLike, request_path: os.PathLike) -> List[str]:
    # -I: no PYTHONPATH, no user site and not the script's folder on sys.path; the child imports nothing of soarpack.
    return [str(python), "-I", str(CHILD_SCRIPT), str(request_path)]


def child_env(scratch: Path) -> Dict[str, str]:
    from soarpack.imagestack import clean_env

    env = clean_env()
    env.update({
        "HF_MODULES_CACHE": str(scratch / "hf-modules"),  # the remote-code copy transformers makes, kept out of ~
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",  # a CPU check even on a GPU box: the stand-ins must answer, not a real driver
        "TOKENIZERS_PARALLELISM": "false",
    })
    return env


def run_child(python: os.PathLike, request: Dict[str, Any], scratch: Path, timeout: float) -> tuple:
    """Run the child; return (its report, its log text)."""
    request = {**request, "scratch": str(scratch), "result": str(scratch / "result.json")}
    request_path = scratch / "request.json"
    request_path.write_text(json.dumps(request, indent=2), encoding="utf-8")
    log_path = scratch / "child.log"
    with open(log_path, "w", encoding="utf-8") as log_fh:
        try:
            proc = subprocess.run(child_command(python, request_path), stdout=log_fh, stderr=subprocess.STDOUT,
                                  env=child_env(scratch), timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ForkCheckError(f"the fork check did not finish in {timeout:.0f} s", f"its log: {log_path}") from None
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    result_path = Path(request["result"])
    if not result_path.is_file():
        tail = " | ".join(line.strip() for line in log_text.strip().splitlines()[-3:])
        raise ForkCheckError(f"the fork check's interpreter {python} exited {proc.returncode} without a report: {tail}")
    return json.loads(result_path.read_text(encoding="utf-8")), log_text


# -- judging ---------------------------------------------------------------------------------------------------


def _fork_to_hf(module: str) -> List[str]:
    """HF linears the fork fuses into `module` (qkv_proj -> q/k/v_proj), or the module itself."""
    from soarpack.recipe.plan import FUSED_GROUPS

    for fused, members in FUSED_GROUPS.items():
        if module.endswith("." + fused):
            prefix = module[: -len(fused)]
            return [prefix + m for m in members]
    return [module]


def _describe_plan(mq) -> str:
    return "16-bit" if mq is None else f"W{mq.bits} g{mq.group_size}"


def _describe_served(row: Dict[str, Any]) -> str:
    if row.get("method") == QUANTIZED_METHOD:
        return f"W{row.get('bits')} g{row.get('group_size')}"
    if row.get("method") in ONLINE_METHODS.values():
        return "16-bit, quantized at load"
    return "16-bit" if row.get("method") == UNQUANTIZED_METHOD else str(row.get("method"))


def _matches(row: Dict[str, Any], mq, unquantized: str = UNQUANTIZED_METHOD) -> bool:
    if mq is None:
        return row.get("method") == unquantized
    return (row.get("method") == QUANTIZED_METHOD and row.get("bits") == mq.bits and row.get("group_size") == mq.group_size
            and row.get("desc_act") == mq.desc_act)


def judge(report: Dict[str, Any], recipe, config, unquantized: str = UNQUANTIZED_METHOD) -> tuple:
    """(rows, problems): each decoder linear of the fork beside the recipe's plan, and every one-line cause.
    `unquantized`: the quant method a linear the plan keeps 16-bit must have (online_method of the server args)."""
    plan = recipe.plan(config)
    rows: List[ModuleRow] = []
    problems: List[str] = []
    covered = set()
    for lin in report.get("linears", []):
        members = _fork_to_hf(lin["module"])
        planned = [plan[m] for m in members if m in plan]
        if not planned:
            problems.append(f"{lin['module']}: a linear of the fork's model that the recipe's plan does not know")
            continue
        covered.update(members)
        mq = planned[0]
        ok = len(set(planned)) == 1 and _matches(lin, mq, unquantized)
        rows.append(ModuleRow(lin["module"], lin.get("method"), lin.get("bits"), lin.get("group_size"),
                              _describe_plan(mq), ok))
        if not ok:
            problems.append(f"{lin['module']}: the fork serves it {_describe_served(lin)} ({lin.get('method')}), "
                            f"recipe {recipe.name} plans {_describe_plan(mq)}")
    for name in sorted(set(plan) - covered):
        problems.append(f"{name}: planned by recipe {recipe.name} but the fork's model has no such linear")
    for orphan in report.get("orphans", []):
        problems.append(f"checkpoint tensor {orphan['tensor']} has no parameter in the fork's model "
                        f"(load_weights raises KeyError {orphan['param']!r}: the server would die loading it)")
    for item in unwritten_required(report):
        part = "never written" if item["unwritten"] == item["numel"] else f"{item['unwritten']} of {item['numel']} elements never written"
        problems.append(f"parameter {item['param']}: {part} by load_weights (a tensor is missing from the checkpoint)")
    return rows, problems


def render_table(rows: Sequence[ModuleRow], problems: Sequence[str]) -> str:
    header = ("module", "fork quant method", "served", "recipe plan", "check")
    body = [(r.module, r.method or "-", _describe_served(r.__dict__), r.planned, "ok" if r.ok else "MISMATCH") for r in rows]
    widths = [max(len(str(x[i])) for x in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    lines.extend(f"FAIL {p}" for p in problems)
    return "\n".join(lines)


def _tree_label(src: Path) -> Tuple[str, Optional[str]]:
    """("fork COMMIT (STATE)", COMMIT), or a label without a commit."""
    from soarpack.serve.patches import check_tree

    try:
        tree = check_tree(src)
    except SoarpackError:
        return "fork tree", None
    return (f"fork {tree.commit} ({tree.state})" if tree.commit else "fork tree (unknown commit)"), tree.commit


# -- the check -------------------------------------------------------------------------------------------------


def run_fork_check(ckpt: os.PathLike, sglang_src: os.PathLike, recipe=None, python: Optional[os.PathLike] = None, *,
                   dev_stack: bool = False, server_args: Optional[Sequence[str]] = None,
                   timeout: float = CHILD_TIMEOUT_S, on_event: EventCallback = no_events) -> ForkCheckResult:
    """Load `ckpt` through the fork at `sglang_src` (its python/ dir) in a child interpreter and judge the result.

    recipe: a name, path or Recipe (default: the one the checkpoint names). python: the child's interpreter
    (default: the image stand-in, built once). server_args: SGLANG_SERVER_ARGS as a list (default: the default
    profile's). Bad input raises a SoarpackError; a checkpoint the fork would not serve returns ok=False.
    """
    from soarpack.sala.config import SalaConfig
    from soarpack.serve.patches import resolve_src
    from soarpack.recipe.profile import DEFAULT_PROFILE, load_profile

    ckpt = Path(ckpt).resolve()
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} is not a directory", "pass the directory soarpack quantize wrote")
    raw = _read_config(ckpt, unquantized_ok=_quantizes_nothing(recipe))
    config = SalaConfig.from_dict(raw, source=str(ckpt / "config.json"))
    recipe = recipe_of(raw, recipe)
    src = resolve_src(sglang_src).resolve()
    args = list(server_args) if server_args is not None else list(load_profile(DEFAULT_PROFILE).args)
    interpreter = resolve_python(python, dev_stack, on_event)

    request = {"ckpt": str(ckpt), "sglang_src": str(src), "server_args": args, "patched_files": patched_files(),
               "standin_remote_config": uses_placeholder_remote_config(ckpt, raw), **platform_request()}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soarpack-forkcheck-") as tmp:
        report, log_text = run_child(interpreter, request, Path(tmp), timeout)
    seconds = time.monotonic() - t0
    where, fork_commit = _tree_label(src)
    if not report.get("ok"):
        cause = report.get("error", "the child reported no cause")
        return ForkCheckResult(False, f"{where}: FAIL: {cause}", f"FAIL {cause}", [cause], report=report, log=log_text,
                               recipe=recipe.name, fork_commit=fork_commit)
    rows, problems = judge(report, recipe, config, online_method(args))
    v = report.get("versions", {})
    stack = f"Python {v.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}"
    verdict = "pass" if not problems else f"FAIL ({len(problems)} problem(s): {problems[0]})"
    summary = (f"{where}, recipe {recipe.name}: {sum(r.ok for r in rows)}/{len(rows)} linears as planned, "
               f"{report.get('tensors_loaded')} tensors loaded, {len(report.get('orphans', []))} without a parameter, "
               f"{len(unwritten_required(report))} parameters unwritten [{stack}; {seconds:.0f} s]: {verdict}")
    return ForkCheckResult(not problems, summary, render_table(rows, problems), problems, rows, report,
                           log=log_text if problems else None, recipe=recipe.name,
                           fork_commit=fork_commit)
