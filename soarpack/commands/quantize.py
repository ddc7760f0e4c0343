"""`soarpack quantize` / `soarpack.quantize()`: the request, declared once (soarpack.request derives the command's
options, the API's signature and help, and the README's rows from it). Fields QuantizeOptions has under the same
name reach it as they are; the few spelled otherwise on the command line are mapped in `to_options`."""

from __future__ import annotations

from typing import Literal, Optional

from soarpack.quant.options import CALIBRATION_DEFAULTS as CAL, QuantizeOptions, quantize_options
from soarpack.request import LoosePath, Option, PathList, Request

_D = QuantizeOptions()


class QuantizeRequest(Request):
    model_dir: LoosePath = Option(..., argument=True, metavar="MODEL_DIR",
                                  help="The original MiniCPM-SALA checkpoint directory.")
    out_dir: LoosePath = Option(..., argument=True, metavar="OUT",
                                help="Where to write the GPTQ checkpoint (atomically).")
    recipe: str = Option(_D.recipe, "--recipe", help="A built-in recipe name or a recipe .toml file.")
    calib: PathList = Option(None, "--calib", metavar="FILE",
                             help="Calibration file(s); repeatable. Default: built-in prompts.")
    held_out: PathList = Option(None, "--held-out", metavar="FILE",
                                help="Held-out file(s) for the sanity loss and KL; repeatable. Default: built-in "
                                     "prompts disjoint from the calibration rows.")
    rows: Optional[int] = Option(None, "-n", "--rows", metavar="N",
                                 help=f"Calibration rows (default: the recipe's, else {CAL.rows}).")
    max_len: Optional[int] = Option(None, "--max-len", metavar="TOKENS",
                                    help=f"Tokens per row, left-truncated, < dense_len (default: the recipe's, else "
                                         f"{CAL.max_len}).")
    seed: Optional[int] = Option(None, "--seed", metavar="N",
                                 help=f"Seed for calibration selection and generation (default: the recipe's, else "
                                      f"{CAL.seed}).")
    batch: Optional[int] = Option(None, "--batch", metavar="N",
                                  help=f"Calibration rows per forward; padding is masked out of the Hessian "
                                       f"(default: the recipe's, else {CAL.batch}).")
    device: Literal["auto", "cpu", "cuda"] = Option(
        "auto", "--device", help="Where to run: a GPU when there is one (auto), cpu or cuda.")
    force: bool = Option(False, "--force", help="Replace a non-empty output directory.")
    log: Optional[LoosePath] = Option(None, "--log", metavar="FILE", renamed_from=("log_file",),
                                      help="Append the run's log, and the libraries' own output, to this file "
                                           "(the command's default: OUT.log beside OUT; the API's: none).")
    max_sanity_loss: float = Option(_D.sanity_max_loss, "--max-sanity-loss", metavar="NATS",
                                    renamed_from=("sanity_max_loss",),
                                    help="Stop if the original model's loss exceeds this.")
    fp16: bool = Option(False, "--fp16", help="Store non-quantized tensors in float16 (default: keep bfloat16).")
    auto_map: Literal["keep", "drop-config"] = Option(
        _D.auto_map, "--auto-map", help="keep, or drop-config (remove auto_map.AutoConfig).")
    no_report: bool = Option(False, "--no-report", help="Skip the KL quality measurement.")
    library_output: Literal["log", "terminal"] = Option(
        "log", cli=False, help="Where the libraries' own output goes while the run lasts: the log, or the terminal "
                               "(the command's -v).")

    def to_options(self) -> QuantizeOptions:
        mapped = {"log": "log_file", "max_sanity_loss": "sanity_max_loss"}
        own = {"model_dir", "out_dir", "fp16", "no_report"}
        given = {mapped.get(k, k): v for k, v in self.model_dump().items() if k not in own}
        return quantize_options(**given, float_dtype="float16" if self.fp16 else "bfloat16", quality=not self.no_report)
