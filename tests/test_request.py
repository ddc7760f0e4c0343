"""Each command declared once: the typed request's fields are the command's options (names, short flags, help,
defaults, choices), the API function's keywords (names, order, defaults, help() lines, old names) and the README's
reference rows, for every function of the Python API (they replace the parity tests and their exception tables)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import get_args

import pytest
import typer.main
from pydantic_core import PydanticUndefined

from soarpack import API_NAMES, api
from soarpack.cli import app
from soarpack.deprecation import renamed_map
from soarpack.commands import REFERENCE_BEGIN, REFERENCE_END, declared_requests, reference

ROOT = Path(__file__).resolve().parent.parent
DECLARED = declared_requests()


def _click_params(command: str):
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def test_every_api_function_is_a_commands_request():
    assert sorted(c.replace("-", "_") for c in DECLARED) == sorted(API_NAMES)
    assert set(DECLARED) <= set(typer.main.get_command(app).commands)


def _command_default(model, name):
    spec = model.spec(name)
    return spec["cli_default"] if spec["has_cli_default"] else model.model_fields[name].default


@pytest.mark.parametrize("command", DECLARED)
def test_the_commands_options_are_the_requests_fields(command):
    model = DECLARED[command]
    params = _click_params(command)
    for name in model.cli_fields():
        info, spec, param = model.model_fields[name], model.spec(name), params[name]
        assert param.help == info.description, name
        if spec["argument"]:
            assert param.param_type_name == "argument" and param.metavar == spec["metavar"], name
            assert param.required == (_command_default(model, name) is PydanticUndefined), name
            assert (param.nargs == -1) == ("List" in repr(info.annotation)), name  # LOG_OR_DIR...
            continue
        declared = [f for flag in model.flags(name) for f in flag.split("/")]  # --warmup/--no-warmup: both
        assert sorted([*param.opts, *param.secondary_opts]) == sorted(declared), name
        for old in spec["old_flags"]:
            assert params["old_" + old.lstrip("-").replace("-", "_")].hidden, old
        default = param.default.value if hasattr(param.default, "value") else param.default
        if info.is_required():
            assert param.required, name
        elif param.multiple:  # a repeatable option given no time: click's None, the request's None or ()
            assert not default and not _command_default(model, name), name
        else:
            assert default == _command_default(model, name), name
        if spec["min"] is not None:
            assert param.min == spec["min"], name
        choices = next((get_args(a) for a in (info.annotation, *get_args(info.annotation))
                        if getattr(a, "__origin__", None) is not None and "Literal" in repr(a)), None)
        if choices:
            assert tuple(c.value for c in param.type_descriptor.annotation) == choices, name
    api_only = set(model.model_fields) - set(model.cli_fields())
    # the command's own: presentation (compare --table), and diagnose --catalogue (the catalogue, not a diagnosis)
    own = {"quiet", "verbose", "json_alias", "table", "catalogue"}
    olds = {p for p in params if p.startswith("old_")}
    assert set(params) - own - olds == set(model.cli_fields()) and not api_only & set(params)


@pytest.mark.parametrize("command", DECLARED)
def test_the_api_functions_keywords_and_help_are_the_requests_fields(command):
    model = DECLARED[command]
    fn = getattr(api, command.replace("-", "_"))
    params = inspect.signature(fn).parameters
    assert [n for n in params if n != "on_event"] == list(model.model_fields)
    for name, info in model.model_fields.items():
        default = params[name].default
        assert (default is inspect.Parameter.empty) == info.is_required() and (info.is_required() or default == info.default)
    doc = inspect.getdoc(fn)
    for name, info in model.model_fields.items():
        line = next(l for l in doc.splitlines() if l.strip().startswith(name + " "))
        assert " ".join(info.description.rstrip(".").split())[:30] in " ".join(doc.split()), name
        if model.spec(name)["cli"] and not model.spec(name)["argument"]:
            assert model.flag(name) in line, name
    assert renamed_map(fn) == model.renamed()


def test_the_readme_reference_is_the_rendering_of_the_requests():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = text.index(REFERENCE_BEGIN), text.index(REFERENCE_END) + len(REFERENCE_END)
    assert text[start:end] + "\n" == reference(), \
        "README.md is stale: paste the output of `python -m soarpack.commands` between its markers"
    for command, model in DECLARED.items():
        for name in model.model_fields:
            assert f"| `{name}` |" in text[start:end], name


def test_a_field_reaches_the_library_under_its_name(tmp_path):
    """Fields QuantizeOptions has under the same name pass through to_options() as they are."""
    model = DECLARED["quantize"]
    request = model.from_api("quantize", dict(model_dir=tmp_path, out_dir=tmp_path / "q", rows=8, device="cpu",
                                              fp16=True, no_report=True, log="x.log", max_sanity_loss=5.0))
    options = request.to_options()
    assert (options.calibration.rows, options.device, options.float_dtype, options.quality, str(options.log_file),
            options.sanity_max_loss) == (8, "cpu", "float16", False, "x.log", 5.0)


def test_a_refusal_names_the_flag_on_the_command_line_and_the_keyword_in_the_api(tmp_path):
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["quantize", str(tmp_path), str(tmp_path / "q"), "--device", "tpu"])
    assert res.exit_code == 2 and "--device" in res.output
    from soarpack.errors import ConfigError

    with pytest.raises(ConfigError, match=r"soarpack.quantize\(\): device='tpu' must be valid"):
        api.quantize(tmp_path, tmp_path / "q", device="tpu")
