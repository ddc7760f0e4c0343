"""`soarpack verify`: is this checkpoint what SGLang's gptq_marlin serves as is, and what we meant to write?

Every problem is collected (not just the first): module set and exact shapes for the config (each decoder linear is
either quantized or matched by a `-:` rule and stored as `.weight`), Marlin compatibility, sequential `g_idx` when
desc_act is false, GPTQ v1 symmetric qzeros, no NaN/Inf, the dtype policy, no derived keys in config.json, no
absolute paths, and, given the original: byte-identical tokenizer/templates/generation config/remote code,
unchanged 16-bit tensors and the per-module dequantization error. An unquantized checkpoint (recipe method "none",
which prepare_model.sh copies) is checked against the original only: the same files, byte for byte.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from soarpack.errors import SoarpackError
from soarpack.placement.content import sha256_file
from soarpack.placement.locks import temp_owner
from soarpack.placement.owner import INCOMPLETE_MARKER
from soarpack.quant.gptq_format import QUANT_PARTS, dequantize, unpack_cols
from soarpack.recipe.checkpoint import base_grid
from soarpack.recipe.plan import (MARLIN_BITS, MARLIN_GROUP_SIZES, MARLIN_IN_MULTIPLE, MARLIN_OUT_MULTIPLE,
                                   ModuleQuant, resolve_plan)

# Properties of the fork's MiniCPMHybridConfig (and other derived values): never keys of config.json.
DERIVED_KEYS = ("has_sparse_attention", "sparse_layer_ids", "lightning_layer_ids", "full_attention_layer_ids",
                "linear_layer_ids", "layers_block_type", "dense_len", "residual_scale", "logits_divisor")
SIDE_FILE_PATTERNS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "chat_template*",
                      "generation_config.json", "*.py", "*.model", "vocab*", "merges.txt")
# Relative Frobenius error ‖W_dq − W‖ / ‖W‖ above which a module is flagged.
MAX_REL_ERROR = {4: 0.3, 8: 0.03}


@dataclass(frozen=True)
class Problem:
    code: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.where}: {self.message}"


@dataclass
class VerifyReport:
    problems: List[Problem] = field(default_factory=list)
    module_errors: Dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"ok": not self.problems, "problems": [asdict(p) for p in self.problems],
                "module_errors": self.module_errors}


def verify_checkpoint(ckpt_dir: str | Path, original: Optional[str | Path] = None, *, device: str = "cpu") -> List[Problem]:
    return verify_report(ckpt_dir, original, device=device).problems


def verify_report(ckpt_dir: str | Path, original: Optional[str | Path] = None, *, output_name: Optional[str] = None, device: str = "cpu") -> VerifyReport:
    """Check a written checkpoint; `device` is where tensors are unpacked and dequantized (a GPU makes the
    per-module comparison of a 9B model take seconds instead of minutes)."""
    from soarpack.sala.checkpoint import iter_tensors, weight_files
    from soarpack.sala.config import SalaConfig

    ckpt = Path(ckpt_dir)
    if original is not None and not Path(original).is_dir():
        from soarpack.errors import CheckpointError

        # a path that is not there is bad input (exit 2), not a problem of the checkpoint (exit 1)
        raise CheckpointError(f"--original {original} {'is not a directory' if Path(original).exists() else 'does not exist'}",
                              "pass the original (unquantized) checkpoint directory")
    rep = VerifyReport()
    add = lambda code, where, msg: rep.problems.append(Problem(code, where, msg))  # noqa: E731

    _check_incomplete(ckpt, add)
    if not (ckpt / "config.json").is_file():
        add("missing-file", "config.json", f"{ckpt} has no config.json")
        return rep
    try:
        raw = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
        config = SalaConfig.from_dict(raw, source="config.json")
    except (json.JSONDecodeError, SoarpackError) as exc:
        add("config", "config.json", str(exc))
        return rep
    qc = raw.get("quantization_config")
    if not isinstance(qc, dict):
        if original is None:
            add("config", "config.json", "no quantization_config (an unquantized checkpoint, recipe method \"none\", "
                "is verified against --original: its files must be the original's)")
        else:
            _compare_copy(ckpt, Path(original), add)
        return rep
    _check_quant_config(qc, ckpt, add)
    _check_config_keys(raw, original, add)
    base = base_grid(qc)
    dynamic = qc.get("dynamic") or {}
    try:
        plan = resolve_plan(config, dynamic, base)
    except re.error as exc:
        add("dynamic", "quantization_config.dynamic", f"a regex does not compile: {exc}")
        return rep

    try:
        names = set(weight_files(ckpt))
    except SoarpackError as exc:
        add("missing-file", "weights", str(exc))
        return rep
    float_dtype = torch.float16 if raw.get("torch_dtype") == "float16" else torch.bfloat16
    expected_float = {}
    for name, shape in config.tensor_shapes().items():
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module in plan and plan[module] is not None:
            continue
        expected_float[name] = shape

    seen = set()
    shapes = config.decoder_linears()
    for module, mq in plan.items():
        out_f, in_f = shapes[module]
        if mq is None:
            if f"{module}.weight" not in names:
                add("missing-weight", module, "kept 16-bit by a -: rule but the checkpoint has no .weight")
            for part in QUANT_PARTS:
                if f"{module}.{part}" in names:
                    add("unexpected-quant", module, f"has .{part} but the dynamic rules keep it unquantized")
            continue
        if f"{module}.weight" in names:
            add("unexpected-weight", module, "quantized by the config but also stored as .weight")
        _check_marlin(module, mq, out_f, in_f, add)
        parts = {}
        missing = [p for p in QUANT_PARTS if f"{module}.{p}" not in names]
        if missing:
            add("missing-quant", module, f"no .{', .'.join(missing)}")
            continue
        for part, tensor in iter_tensors(ckpt, {f"{module}.{p}" for p in QUANT_PARTS}, device=device):
            parts[part.rsplit(".", 1)[1]] = tensor
            seen.add(part)
        _check_module(module, mq, out_f, in_f, parts, add)

    for name in sorted(names - seen - set(expected_float)):
        add("unexpected-tensor", name, "not part of this config's checkpoint")
    for name, tensor in iter_tensors(ckpt, names & set(expected_float)):
        seen.add(name)
        if tuple(tensor.shape) != tuple(expected_float[name]):
            add("shape", name, f"shape {tuple(tensor.shape)}, config implies {tuple(expected_float[name])}")
        if tensor.dtype != float_dtype:
            add("dtype", name, f"{tensor.dtype}, expected {float_dtype} (torch_dtype {raw.get('torch_dtype')})")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            add("nan", name, "holds NaN or Inf")
    for name in sorted(set(expected_float) - seen):
        if not name.endswith(".weight") or name[: -len(".weight")] not in plan:  # linears were reported above
            add("missing-tensor", name, "not in the checkpoint")

    _check_paths(ckpt, original, output_name, add)
    if original is not None:
        _compare_original(ckpt, Path(original), plan, names, expected_float, rep, add, device)
    return rep


def _check_incomplete(ckpt: Path, add) -> None:
    """The temp folder of a run that has not finished (killed, or still going) is not a result, however complete
    it looks; the run's own verify of its temp folder is the exception."""
    found = temp_owner(ckpt)
    if found is None:
        return
    owner, state = found
    if state == "self":
        return
    whose = {"running": "still running", "gone": "killed before it finished", "unknown": "on another host or unknown"}
    add("incomplete", INCOMPLETE_MARKER,
        f"{ckpt} is the temporary folder of an unfinished soarpack run for {owner.get('target')} (pid "
        f"{owner.get('pid')} on {owner.get('host')}, started {owner.get('started')}, {whose[state]}): not a result")


def _check_quant_config(qc: Dict[str, Any], ckpt: Path, add) -> None:
    want = {"quant_method": "gptq", "checkpoint_format": "gptq", "sym": True, "lm_head": False}
    for key, value in want.items():
        if qc.get(key) != value:
            add("quant-config", f"quantization_config.{key}", f"is {qc.get(key)!r}, gptq_marlin needs {value!r}")
    if qc.get("bits") not in MARLIN_BITS:
        add("marlin", "quantization_config.bits", f"{qc.get('bits')!r} is not 4 or 8")
    if qc.get("group_size") not in MARLIN_GROUP_SIZES:
        add("marlin", "quantization_config.group_size", f"{qc.get('group_size')!r} is not -1/32/64/128")
    qf = ckpt / "quantize_config.json"
    if not qf.is_file():
        add("missing-file", "quantize_config.json", "not written")
    else:
        try:
            other = json.loads(qf.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            add("quant-config", "quantize_config.json", "not valid JSON")
            return
        if not isinstance(other, dict):
            add("quant-config", "quantize_config.json", f"a JSON {type(other).__name__}, not an object")
            return
        for key in ("bits", "group_size", "sym", "desc_act", "quant_method", "checkpoint_format", "dynamic"):
            if other.get(key) != qc.get(key):
                add("quant-config", f"quantize_config.json {key}", f"{other.get(key)!r} != config.json's {qc.get(key)!r}")


def _check_config_keys(raw: Dict[str, Any], original, add) -> None:
    for key in DERIVED_KEYS:
        if key in raw:
            add("derived-key", f"config.json {key}", "a derived key; SGLang's config class crashes on it")
    if original is None:
        return
    try:
        orig = json.loads((Path(original) / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return
    for key in sorted(set(raw) - set(orig) - {"quantization_config"}):
        add("derived-key", f"config.json {key}", "not in the original config.json")
    for key in sorted(set(orig) - set(raw)):
        add("config", f"config.json {key}", "an original field was dropped")
    for key in sorted(set(orig) & set(raw)):
        if key in ("auto_map", "torch_dtype"):
            continue
        if orig[key] != raw[key]:
            add("config", f"config.json {key}", f"changed from {orig[key]!r} to {raw[key]!r}")


def _check_marlin(module: str, mq: ModuleQuant, out_f: int, in_f: int, add) -> None:
    if not mq.sym:
        add("marlin", module, "asymmetric (gptq_marlin needs sym)")
    if mq.bits not in MARLIN_BITS:
        add("marlin", module, f"bits {mq.bits}")
    if mq.group_size not in MARLIN_GROUP_SIZES:
        add("marlin", module, f"group_size {mq.group_size}")
    if out_f % MARLIN_OUT_MULTIPLE or in_f % MARLIN_IN_MULTIPLE or (mq.group_size > 0 and in_f % mq.group_size):
        add("marlin", module, f"shape [{out_f}, {in_f}] does not tile (out % 64, in % 128, in % group)")


def _check_module(module: str, mq: ModuleQuant, out_f: int, in_f: int, parts: Dict[str, torch.Tensor], add) -> None:
    p = 32 // mq.bits
    groups = in_f // mq.group_size if mq.group_size > 0 else 1
    want = {"qweight": (in_f // p, out_f), "qzeros": (groups, out_f // p), "scales": (groups, out_f), "g_idx": (in_f,)}
    dtypes = {"qweight": torch.int32, "qzeros": torch.int32, "scales": torch.float16, "g_idx": torch.int32}
    ok = True
    for part, shape in want.items():
        t = parts[part]
        if tuple(t.shape) != shape:
            add("shape", f"{module}.{part}", f"shape {tuple(t.shape)}, expected {shape} for {mq.bits}-bit g{mq.group_size}")
            ok = False
        if t.dtype != dtypes[part]:
            add("dtype", f"{module}.{part}", f"{t.dtype}, expected {dtypes[part]}")
    if not ok:
        return
    if not torch.isfinite(parts["scales"]).all():
        add("nan", f"{module}.scales", "holds NaN or Inf")
    if not mq.desc_act:
        seq = torch.arange(in_f, dtype=torch.int32, device=parts["g_idx"].device) // (mq.group_size if mq.group_size > 0 else in_f)
        if not torch.equal(parts["g_idx"].to(torch.int32), seq):
            add("g_idx", module, "g_idx is not sequential but desc_act is false")
    zeros = unpack_cols(parts["qzeros"], mq.bits)
    sym_zero = (1 << (mq.bits - 1)) - 1  # v1 stores zero − 1
    if not bool((zeros == sym_zero).all()):
        add("qzeros", module, f"zeros are not the GPTQ v1 symmetric value {sym_zero} "
                              f"(found {sorted(set(zeros.unique().tolist()))[:4]}): asymmetric or v2 layout")


def _check_paths(ckpt: Path, original, output_name: Optional[str], add) -> None:
    needles = {str(ckpt.resolve())}
    if original is not None:
        needles.add(str(Path(original).resolve()))
    home = str(Path.home())
    if home not in ("/", ""):
        needles.add(home + "/")
    for path in sorted(ckpt.iterdir()):
        if not path.is_file() or path.suffix not in (".json", ".txt", ".jinja", ".md"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for needle in needles:
            if needle in text:
                add("abs-path", path.name, f"contains the machine path {needle}")


def _compare_copy(ckpt: Path, orig: Path, add) -> None:
    """An unquantized checkpoint (recipe method "none", as prepare_model.sh copies it): the original's files, each
    byte for byte (a hard link to the same file counts as identical without reading it), and nothing else."""
    def files(root: Path) -> Dict[str, Path]:
        return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}

    ours, theirs = files(ckpt), files(orig)
    for name in sorted(set(theirs) - set(ours)):
        add("copy-missing", name, "in the original but not in the checkpoint")
    for name in sorted(set(ours) - set(theirs)):
        add("copy-extra", name, "not in the original (an unquantized checkpoint is the original, file for file)")
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a.stat().st_size != b.stat().st_size or (not a.samefile(b) and sha256_file(a) != sha256_file(b)):
            add("copy-differs", name, "differs from the original")


def _compare_original(ckpt: Path, orig: Path, plan, names, expected_float, rep: VerifyReport, add, device: str) -> None:
    from soarpack.sala.checkpoint import iter_tensors

    for pattern in SIDE_FILE_PATTERNS:
        for src in sorted(orig.glob(pattern)):
            if not src.is_file():
                continue
            dst = ckpt / src.name
            if not dst.is_file():
                add("side-file", src.name, "missing (copy it from the original)")
            elif sha256_file(dst) != sha256_file(src):
                add("side-file", src.name, "differs from the original (re-serialised?)")
    orig_names = set()
    try:
        from soarpack.sala.checkpoint import weight_files

        orig_names = set(weight_files(orig))
    except SoarpackError as exc:
        add("original", str(orig), str(exc))
        return
    # 16-bit tensors must be the original values.
    keep = sorted(set(expected_float) & names & orig_names)
    ours = dict(iter_tensors(ckpt, set(keep)))
    for name, t in iter_tensors(orig, set(keep)):
        mine = ours.get(name)
        if mine is not None and mine.shape == t.shape and not torch.equal(mine.to(torch.float32), t.to(torch.float32).to(mine.dtype).to(torch.float32)):
            add("changed-tensor", name, "differs from the original")
    # Per-module dequantization error.
    qmods = [m for m, mq in plan.items() if mq is not None and all(f"{m}.{p}" in names for p in QUANT_PARTS)]
    for module in qmods:
        mq = plan[module]
        parts = {n.rsplit(".", 1)[1]: t for n, t in iter_tensors(ckpt, {f"{module}.{p}" for p in QUANT_PARTS}, device=device)}
        w = dict(iter_tensors(orig, {f"{module}.weight"}, device=device)).get(f"{module}.weight")
        if w is None:
            continue
        try:
            dq = dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], mq.bits, mq.group_size)
        except (RuntimeError, IndexError) as exc:
            add("dequant", module, f"cannot dequantize: {exc}")
            continue
        if dq.shape != w.shape:
            continue
        wf = w.to(torch.float32)
        err = float((dq - wf).norm() / wf.norm().clamp_min(1e-12))
        rep.module_errors[module] = round(err, 6)
        limit = MAX_REL_ERROR.get(mq.bits, 0.3)
        if not err <= limit:
            add("dequant-error", module, f"relative error {err:.3f} > {limit} for {mq.bits}-bit")
