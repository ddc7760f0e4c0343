"""Lint SGLang server args before a platform run is spent on them.

`lint_args(args, recipe=..., patched=..., server_args_py=...)` returns findings; an "error" means the server
will not start, will run far slower than it should, or serves the checkpoint wrong. Each rule has an id (RULES)
so a test, a report or a human can point at it.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Union

from soarpack.errors import ConfigError
from soarpack.facts import launch
from soarpack.recipe.model import Recipe, load_recipe
from soarpack.serve.serverargs import FlagSpec, known_flags, split_args

RULES: Dict[str, str] = {
    "underscore-flag": "flag names are hyphenated (the platform image does not convert '_')",
    "not-a-flag": "a token where a --flag was expected",
    "unknown-flag": "a flag the fork's server_args.py does not declare",
    "missing-value": "a flag that takes a value was given none",
    "bad-choice": "a value outside the flag's choices",
    "duplicate-flag": "a flag given twice (aliases included)",
    "gptq-needs-fp16": "--quantization gptq (exllama) runs fp16 only; bf16 needs gptq_marlin",
    "cuda-graph-disabled": "--disable-cuda-graph makes decode ~3.5x slower (a peer timed out the 5 h task)",
    "fp8-kv-sparse-unpatched": "an fp8 KV cache on the sparse backend without our fp8 patches",
    "fp8-kv-pool-uncapped": "fp8-kv-compressed-keys allocates a bf16 copy of the key pool after the pool: cap it with --max-total-tokens",
    "fp8-kv-flashattn": "an fp8 KV cache on minicpm_flashattn (our patches cover the FlashInfer kernel only)",
    "fp16-sparse-unpatched": "--dtype float16 on the sparse backend without the sparse-dtype patch",
    "fp16-accuracy": "fp16 serving lost half the accuracy in a peer's runs (83.0 -> 46.6)",
    "marlin-asym-recipe": "gptq_marlin serves symmetric quantization only",
    "marlin-grid": "gptq_marlin serves bits 4/8 and group size -1/32/64/128 only",
    "marlin-desc-act": "desc_act = true is slower under gptq_marlin",
    "no-quantization": "no --quantization: SGLang picks the method from the checkpoint",
    "quantization-recipe": "--quantization disagrees with the checkpoint the recipe makes (GPTQ, or unquantized)",
    "force-dense-sparse-backend": "--force-dense-minicpm with a minicpm_* backend: the sparse backend refuses a dense config",
    "dense-as-sparse-ignored": "--dense-as-sparse only acts on the minicpm sparse backend",
    "no-attention-backend": "no --attention-backend: SGLang picks one for the hybrid model",
    "cuda-graph-bs": f"CUDA graphs captured for fewer than {launch.MAX_RUNNING_REQUESTS} running requests: larger batches run eager",
    "platform-override": f"the platform sets this flag itself after ours, so ours is ignored ({launch.overrides_phrase()})",
    "platform-flag-wins": "a flag the platform sets before ours (--port, --model-path): ours wins and the platform "
                          "waits for health on its own port, or serves another path",
    "unknown-patch": "a patch name the patch set does not have",
    "patch-requires": "a patch without the patch it is written on top of (its Requires: line)",
    "mem-fraction-range": "--mem-fraction-static is the share of GPU memory for weights and KV pool: a number in (0, 1)",
    "unsafe-token": "a token the platform's unquoted ${SGLANG_SERVER_ARGS} would split, glob or keep quotes in",
}
ERROR_RULES = {
    "underscore-flag", "not-a-flag", "unknown-flag", "missing-value", "bad-choice", "duplicate-flag", "gptq-needs-fp16",
    "cuda-graph-disabled", "fp8-kv-sparse-unpatched", "fp8-kv-flashattn", "fp16-sparse-unpatched",
    "marlin-asym-recipe", "marlin-grid", "force-dense-sparse-backend", "unknown-patch", "patch-requires",
    "quantization-recipe",
    "mem-fraction-range", "unsafe-token", "platform-flag-wins",
}
PLATFORM_FLAGS = launch.PLATFORM_FLAGS
# The platform's flags before SGLANG_SERVER_ARGS on its launch line: argparse keeps the last value, so a profile
# that sets one overrides the platform's; those after it (launch.TRAILING_ARGS) override the profile's.
LEADING_PLATFORM_FLAGS = tuple(f for f in PLATFORM_FLAGS if f in launch.leading_args("OUT"))
_LEADING_WHY = {
    launch.PORT_FLAG: "the server listens there, while the platform's health check and eval wait on its own "
                      f"{launch.PORT_FLAG} {launch.PORT}, so the run times out",
    launch.MODEL_PATH_FLAG: "the server loads that path instead of the checkpoint the platform's preprocessing wrote",
}
FP8_PATCHES = frozenset({"fp8-kv-query", "fp8-kv-compressed-keys"})
GPTQ_METHODS = ("gptq_marlin", "gptq")  # the --quantization values that read a GPTQ checkpoint
DTYPE_PATCH = "sparse-dtype"
SPARSE_BACKENDS = ("minicpm_flashinfer", "minicpm_flashattn")
PLATFORM_MAX_RUNNING = launch.MAX_RUNNING_REQUESTS
# The platform expands ${SGLANG_SERVER_ARGS} unquoted (SALA.md 1): a token arrives intact under word splitting,
# globbing, `sh -c` and `eval` alike only if it has none of the shell's special characters. This is the set
# shlex.quote leaves unquoted.
SAFE_TOKEN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
SAFE_CHARS = "letters, digits and _@%+=:,./-"


def _unsafe_why(token: str) -> str:
    """What the platform's shell does to a token outside SAFE_TOKEN."""
    if not token:
        return "an empty token vanishes"
    if any(c.isspace() for c in token):
        return f"it is split into {len(token.split()) or 0} words at its spaces"
    if any(c in "\"'" for c in token):
        return "its quotes arrive literally (the shell does not read quotes in an expanded variable)"
    if any(c in "*?[" for c in token):
        return "the shell expands it to matching file names, if any exist"
    bad = next(c for c in token if not SAFE_TOKEN.fullmatch(c))
    return f"{bad!r} means something to the shell (under `sh -c` or `eval` it is not passed as written)"


def unsafe_tokens(tokens: Sequence[str]) -> List[Finding]:
    """One `unsafe-token` finding per token that would not reach the server as written."""
    return [_finding("unsafe-token", f"{tok!r} cannot pass through the platform's unquoted ${{SGLANG_SERVER_ARGS}}: "
                                     f"{_unsafe_why(tok)}; use only {SAFE_CHARS}")
            for tok in tokens if not SAFE_TOKEN.fullmatch(tok)]


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.level} {self.rule}: {self.message}"

    def to_dict(self) -> Dict[str, str]:
        return asdict(self)


def _finding(rule: str, message: str) -> Finding:
    return Finding("error" if rule in ERROR_RULES else "warning", rule, message)


def recipe_grid(recipe: Any) -> Recipe:
    """The Recipe a name, path or Recipe names, read even when Marlin cannot serve it, so the lint can say why."""
    return load_recipe(recipe, servable=False)


def _parse(tokens: Sequence[str], flags: Dict[str, FlagSpec], out: List[Finding]) -> Dict[str, Optional[str]]:
    """Tokens -> {canonical flag: value or None}; syntax findings go to `out`."""
    seen: Dict[str, Optional[str]] = {}
    spelled: Dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            out.append(_finding("not-a-flag", f"{tok!r} is not a --flag (a value without its flag, or a single dash)"))
            continue
        name, eq, inline = tok.partition("=")
        if "_" in name:
            fixed = name.replace("_", "-")
            out.append(_finding("underscore-flag", f"{name} must be written {fixed}"))
            name = fixed
        spec = flags.get(name)
        if spec is None:
            out.append(_finding("unknown-flag", f"{name} is not a flag of this SGLang fork"))
            if not eq and i < len(tokens) and not tokens[i].startswith("--"):
                i += 1  # skip its probable value so it is not reported again
            continue
        value: Optional[str] = None
        if spec.takes_value:
            if eq:
                value = inline
            elif i < len(tokens) and not tokens[i].startswith("--"):
                value = tokens[i]
                i += 1
            else:
                out.append(_finding("missing-value", f"{name} needs a value"))
                continue
            if spec.choices and value not in spec.choices:
                out.append(_finding("bad-choice", f"{name} {value}: expected one of {', '.join(spec.choices)}"))
        elif eq:
            out.append(_finding("bad-choice", f"{name} takes no value (got {inline!r})"))
        canonical = spec.canonical or name
        if canonical in seen:
            out.append(_finding("duplicate-flag", f"{name} given twice (first as {spelled[canonical]})"))
        seen[canonical] = value
        spelled.setdefault(canonical, name)
    return seen


def _in_open_unit_interval(value: str) -> bool:
    try:
        return 0.0 < float(value) < 1.0
    except ValueError:
        return False


def lint_args(
    args: Union[str, Sequence[str]],
    *,
    recipe: Any = None,
    patched: Optional[Set[str]] = None,
    server_args_py: Optional[os.PathLike] = None,
    known_patches: Optional[Iterable[str]] = None,
) -> List[Finding]:
    """Findings for a server-args list or SGLANG_SERVER_ARGS string.

    recipe: the quantization recipe the served checkpoint was made with (name, path or Recipe), if known.
    patched: names of our patches applied to the server's tree (None: none).
    server_args_py: the fork's server_args.py (or its python/ dir) to read the flags from; the recorded table otherwise.
    known_patches: the patch names that exist (checked against `patched`); our patch set when None.
    """
    flags = known_flags(server_args_py)
    findings: List[Finding] = []
    tokens = split_args(args)
    # A string is checked as the platform's shell gets it: split at whitespace, its quotes not read.
    findings += unsafe_tokens(args.split() if isinstance(args, str) else tokens)
    got = _parse(tokens, flags, findings)
    patched = set(patched or ())

    if known_patches is None:
        from soarpack.serve.patches import list_patches

        known_patches = list_patches()
    known_patches = set(known_patches)
    for name in sorted(patched - known_patches):
        findings.append(_finding("unknown-patch", f"patch {name!r} is not in the patch set ({', '.join(sorted(known_patches))})"))
    if patched:
        from soarpack.serve.patches import missing_requirements

        for name, missing in missing_requirements(sorted(patched & known_patches)):
            findings.append(_finding("patch-requires", f"patch {name!r} is written on top of {', '.join(missing)}: "
                                                       f"add {', '.join(missing)} to the patches"))

    quant = got.get("--quantization")
    dtype = got.get("--dtype", "auto")
    kv = got.get("--kv-cache-dtype", "auto")
    backend = got.get("--attention-backend")
    force_dense = "--force-dense-minicpm" in got
    sparse = backend in SPARSE_BACKENDS and not force_dense
    fp8_kv = kv.startswith("fp8")
    fp16 = dtype in ("half", "float16")

    if quant == "gptq" and not fp16:
        findings.append(_finding("gptq-needs-fp16", f"--quantization gptq with --dtype {dtype}: the exllama kernel is fp16-only and fp16 "
                                                    "cost half the accuracy; use --quantization gptq_marlin with --dtype bfloat16"))
    if "--disable-cuda-graph" in got:
        findings.append(_finding("cuda-graph-disabled", "--disable-cuda-graph: decode runs eager, ~3.5x slower at S1; remove it"))
    if backend is None:
        findings.append(_finding("no-attention-backend", "no --attention-backend; pass minicpm_flashinfer (sparse) or flashinfer with --force-dense-minicpm"))
    if force_dense and backend in SPARSE_BACKENDS:
        findings.append(_finding("force-dense-sparse-backend", f"--force-dense-minicpm with --attention-backend {backend}: SALA's sparse backend "
                                                               "refuses a dense config at start; use --attention-backend flashinfer"))
    if "--dense-as-sparse" in got and not sparse:
        findings.append(_finding("dense-as-sparse-ignored", "--dense-as-sparse has no effect without the minicpm sparse backend; drop it"))
    if fp8_kv and sparse:
        if backend == "minicpm_flashattn":
            findings.append(_finding("fp8-kv-flashattn", f"--kv-cache-dtype {kv} on minicpm_flashattn: our fp8 patches cover the FlashInfer kernel; "
                                                         "use --attention-backend minicpm_flashinfer"))
        if "fp8-kv-compressed-keys" in patched and "--max-total-tokens" not in got:
            findings.append(_finding("fp8-kv-pool-uncapped", "no --max-total-tokens: the pool takes the memory the compressed-key buffer "
                                                             "(as large as the key pool, in bf16) needs at CUDA-graph warm-up; "
                                                             "pass e.g. --max-total-tokens 4194304"))
        missing = sorted(FP8_PATCHES - patched)
        if missing:
            findings.append(_finding("fp8-kv-sparse-unpatched", f"--kv-cache-dtype {kv} on the sparse backend needs patches {', '.join(missing)} "
                                                                "(q is cast to fp8 and compressed keys go through the fp8 pool otherwise)"))
    if fp16:
        if sparse and DTYPE_PATCH not in patched:
            findings.append(_finding("fp16-sparse-unpatched", f"--dtype {dtype} on the sparse backend needs the {DTYPE_PATCH} patch "
                                                              "(bf16 is hard-coded: 'query and key must have the same dtype')"))
        findings.append(_finding("fp16-accuracy", f"--dtype {dtype}: a peer's fp16 runs fell from 83.0 to 46.6 accuracy; serve bfloat16"))

    grid = recipe_grid(recipe) if recipe is not None else None
    if grid is not None and not grid.quantizes:
        if quant in GPTQ_METHODS:
            findings.append(_finding("quantization-recipe", f"--quantization {quant} with recipe {grid.name}, which quantizes "
                                                            "nothing: the checkpoint is the original bf16 one, without the "
                                                            "qweight a GPTQ method loads; use --quantization fp8 or none"))
    elif grid is not None:
        if quant is None:
            findings.append(_finding("no-quantization", f"recipe {grid.name} is GPTQ; pass --quantization gptq_marlin so the kernel is certain"))
        elif quant not in GPTQ_METHODS:
            findings.append(_finding("quantization-recipe", f"--quantization {quant} with GPTQ recipe {grid.name}: the fork "
                                                            "refuses a method that disagrees with the checkpoint's "
                                                            "quantization_config; use --quantization gptq_marlin (or a "
                                                            "recipe with method = \"none\" for online fp8)"))
        if quant in ("gptq_marlin", None):
            if not grid.sym:
                findings.append(_finding("marlin-asym-recipe", f"recipe {grid.name} is asymmetric (sym = false); gptq_marlin serves sym only: "
                                                               "set sym = true and quantize again"))
            if grid.bits not in (4, 8) or grid.group_size not in (-1, 32, 64, 128):
                findings.append(_finding("marlin-grid", f"recipe {grid.name}: bits {grid.bits}, group_size {grid.group_size} is not a Marlin grid "
                                                        "(bits 4/8, group -1/32/64/128)"))
            if grid.desc_act:
                findings.append(_finding("marlin-desc-act", f"recipe {grid.name} has desc_act = true: Marlin then reorders activations; "
                                                            "desc_act = false is faster"))

    mem = got.get("--mem-fraction-static")
    if mem is not None and not _in_open_unit_interval(mem):
        findings.append(_finding("mem-fraction-range", f"--mem-fraction-static {mem}: expected a number in (0, 1), e.g. 0.85"))
    bs = got.get("--cuda-graph-max-bs")
    if bs is not None and bs.isdigit() and int(bs) < PLATFORM_MAX_RUNNING:
        findings.append(_finding("cuda-graph-bs", f"--cuda-graph-max-bs {bs} < {PLATFORM_MAX_RUNNING}: decode batches above it run without CUDA graphs"))
    canon = {f: (flags[f].canonical or f) if f in flags else f for f in PLATFORM_FLAGS}
    for flag in PLATFORM_FLAGS:
        if canon[flag] not in got:
            continue
        if flag in LEADING_PLATFORM_FLAGS:
            findings.append(_finding("platform-flag-wins", f"{flag} {got[canon[flag]]}: the platform's launch line puts "
                                                            f"its own {flag} before ours, so ours wins: "
                                                            f"{_LEADING_WHY.get(flag, 'its value is lost')}; drop it"))
        else:
            findings.append(_finding("platform-override", f"{flag}: the platform's launch line puts its own {flag} "
                                                           f"after ours, so ours is ignored; drop it"))
    return findings


def errors(findings: Iterable[Finding]) -> List[Finding]:
    return [f for f in findings if f.level == "error"]


def raise_on_errors(findings: Sequence[Finding], what: str = "server args") -> None:
    bad = errors(findings)
    if bad:
        raise ConfigError(f"{what}: {len(bad)} lint error(s): " + "; ".join(f"{f.rule}: {f.message}" for f in bad),
                          "fix the flags (soarpack args PROFILE shows every finding)")


def lint_profile(profile: Any, *, patched: Optional[Set[str]] = None, server_args_py: Optional[os.PathLike] = None) -> List[Finding]:
    """lint_args for a serving profile (name, path or Profile) with its recipe; patched defaults to its own patches."""
    from soarpack.recipe.profile import load_profile

    prof = load_profile(profile)
    return lint_args(prof.args, recipe=prof.recipe, patched=set(prof.patches) if patched is None else patched,
                     server_args_py=server_args_py)
