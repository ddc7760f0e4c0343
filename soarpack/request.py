"""One typed request per command: a pydantic model whose fields carry their command-line spelling. From it are
derived the command's Typer options (names, short flags, help, defaults, choices), the Python API's keyword
signature and its help() text, and the README's reference rows; a test keeps the three equal to the model. Adding
an option is adding one field.

    class QuantizeRequest(Request):
        rows: Optional[int] = Option(None, "-n", "--rows", metavar="N", help="Calibration rows.")
"""

from __future__ import annotations

import enum
import inspect
import os
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

from pydantic import BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from soarpack.errors import ConfigError
from soarpack.schema import StrictModel

R = TypeVar("R", bound="Request")

LoosePath = Annotated[Path, Field(strict=False)]  # a str or a Path (bytes are refused)


def _one_or_many(value: Any) -> Any:
    """One path or several: a str or a path is a list of one, a tuple a list; empty is None."""
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if isinstance(value, tuple):
        value = list(value)
    return value or None


PathList = Annotated[Optional[List[LoosePath]], BeforeValidator(_one_or_many)]


def _names(value: Any) -> Any:
    """Names given as a list or a tuple (or none: None) are a tuple."""
    return () if value is None else tuple(value) if isinstance(value, list) else value


Names = Annotated[Tuple[str, ...], BeforeValidator(_names)]  # a repeatable option of words (check --accept-risk)


_SAME = object()


def Option(default: Any, *flags: str, help: str, metavar: Optional[str] = None, renamed_from: Sequence[str] = (),
           old_flags: Sequence[str] = (), cli: bool = True, argument: bool = False, cli_default: Any = _SAME,
           min: Optional[int] = None) -> Any:
    """A request field (capitalized as typer.Option and pydantic's Field are): its default, its flags (`"-n", "--rows"`; none: `--field-name`; an `argument` is
    positional, MODEL_DIR), its help line, the old keyword names the API still takes (a DeprecationWarning) and the
    old flags the command still takes (hidden, with a note). `cli=False`: the API's only (the command sets it
    itself); `cli_default`: the command's own default where it differs (eval writes eval.json, the API no file);
    `min`: the command line refuses less as it parses (the library checks the API's)."""
    extra = {"flags": list(flags), "metavar": metavar, "renamed_from": list(renamed_from), "cli": cli,
             "argument": argument, "old_flags": list(old_flags), "min": min,
             "cli_default": None if cli_default is _SAME else cli_default, "has_cli_default": cli_default is not _SAME}
    return Field(default, description=help, json_schema_extra=extra)


class Request(StrictModel):
    """A command's typed request (frozen, strict: an int is never a str, a path never bytes)."""

    @classmethod
    def spec(cls, name: str) -> Dict[str, Any]:
        return dict(cls.model_fields[name].json_schema_extra or {})  # type: ignore[arg-type]

    @classmethod
    def flags(cls, name: str) -> List[str]:
        flags = cls.spec(name)["flags"]
        return flags or ["--" + name.replace("_", "-")]

    @classmethod
    def flag(cls, name: str) -> str:
        """The long flag (or the metavar of an argument): what a refusal names."""
        spec = cls.spec(name)
        return spec["metavar"] if spec["argument"] else max(cls.flags(name), key=len)

    @classmethod
    def cli_fields(cls) -> List[str]:
        return [n for n in cls.model_fields if cls.spec(n)["cli"]]

    @classmethod
    def renamed(cls) -> Dict[str, str]:
        """old keyword -> field, from every field's `renamed_from`."""
        return {old: name for name in cls.model_fields for old in cls.spec(name)["renamed_from"]}

    @classmethod
    def from_cli(cls: Type[R], values: Dict[str, Any]) -> R:
        return _validated(cls, values, lambda name, given: f"{cls.flag(name)} {given}")

    @classmethod
    def from_api(cls: Type[R], function: str, values: Dict[str, Any]) -> R:
        return _validated(cls, values, lambda name, given: f"soarpack.{function}(): {name}={given}")


def _validated(model: Type[R], values: Dict[str, Any], naming: Callable[[str, str], str]) -> R:
    try:
        return model(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "value"
        given = "missing" if err["type"] == "missing" else f"{values.get(name, err.get('input'))!r:.80}"
        raise ConfigError(f"{naming(name, given)} must be valid: {err['msg'][0].lower()}{err['msg'][1:]}") from None


# -- the derived surfaces ------------------------------------------------------------------------------------------

def _default(info: FieldInfo) -> Any:
    return inspect.Parameter.empty if info.default is PydanticUndefined else info.default


def _choices(annotation: Any) -> Optional[Tuple[str, ...]]:
    """The values of a Literal (possibly Optional) annotation."""
    for arm in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arm) is typing.Literal:
            return tuple(typing.get_args(arm))
    return None


_ENUMS: Dict[Tuple[str, Tuple[str, ...]], Type[enum.Enum]] = {}


def choice_enum(name: str, values: Tuple[str, ...]) -> Type[enum.Enum]:
    """A str Enum of `values`, so that --help lists them and a typo fails before any work (one per field)."""
    key = (name, values)
    if key not in _ENUMS:
        _ENUMS[key] = enum.Enum(name, {v.replace("-", "_"): v for v in values}, type=str)  # type: ignore[misc]
    return _ENUMS[key]


def _cli_annotation(name: str, annotation: Any) -> Any:
    choices = _choices(annotation)
    if choices:
        return choice_enum(name, choices)
    text = repr(annotation)
    if any(word in text for word in ("List", "list", "Tuple", "tuple")):
        return Optional[List[Path]] if "Path" in text else Optional[List[str]]
    if "Path" in text:
        return Optional[Path]
    return annotation


def typer_parameters(model: Type[Request]) -> List[inspect.Parameter]:
    """The command's parameters: one Typer argument or option per CLI field, in the model's order."""
    import typer

    params = []
    for name in model.cli_fields():
        info, spec = model.model_fields[name], model.spec(name)
        default = spec["cli_default"] if spec.get("has_cli_default") else _default(info)
        choices = _choices(info.annotation)
        shown = default if not choices or default is inspect.Parameter.empty else choice_enum(name, choices)(default)
        typer_default = ... if default is inspect.Parameter.empty else None if default == () else shown
        if spec["argument"]:
            made = typer.Argument(typer_default, metavar=spec["metavar"], help=info.description, show_default=False)
        elif info.annotation is bool:
            made = typer.Option(typer_default, *model.flags(name), help=info.description)
        else:
            bounds = {} if spec.get("min") is None else {"min": spec["min"]}
            made = typer.Option(typer_default, *model.flags(name), metavar=spec["metavar"], help=info.description,
                                **bounds)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=made,
                                        annotation=_cli_annotation(name, info.annotation)))
        for old in spec.get("old_flags", ()):
            params.append(inspect.Parameter(_old_name(old), inspect.Parameter.KEYWORD_ONLY,
                                            default=typer.Option(None, old, hidden=True),
                                            annotation=Optional[_cli_annotation(name, info.annotation)]))
    return params


def _old_name(flag: str) -> str:
    return "old_" + flag.lstrip("-").replace("-", "_")


def old_flag_values(model: Type[Request], kwargs: Dict[str, Any]) -> List[Tuple[str, str, str, Any]]:
    """(field, its flag, the old flag, the old flag's value) for each old flag of the command, popped from kwargs."""
    found = []
    for name in model.cli_fields():
        for old in model.spec(name).get("old_flags", ()):
            found.append((name, model.flag(name), old, kwargs.pop(_old_name(old))))
    return found


def cli_values(model: Type[Request], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The command's parsed options as the request's values (choices back to their strings, an empty list None)."""
    out = {}
    for name in model.cli_fields():
        value = kwargs.pop(name)
        out[name] = value.value if isinstance(value, enum.Enum) else (value or None) if isinstance(value, list) else value
    return out


def api_signature(model: Type[Request], positional: int = 0, extra: Sequence[inspect.Parameter] = ()) -> inspect.Signature:
    """The API function's signature: the first `positional` fields positional, the rest keyword-only, then `extra`."""
    kinds = [inspect.Parameter.POSITIONAL_OR_KEYWORD] * positional
    params = [inspect.Parameter(name, kinds[i] if i < positional else inspect.Parameter.KEYWORD_ONLY,
                                default=_default(info), annotation=_api_annotation(info.annotation))
              for i, (name, info) in enumerate(model.model_fields.items())]
    return inspect.Signature([*params, *extra])


def _api_annotation(annotation: Any) -> Any:
    """What help() shows: the API's path types by name (a str or a path; one or several)."""
    text = repr(annotation)
    if "Tuple[str" in text:
        return "Sequence[str]"
    if "Path" not in text:
        return annotation
    if "List" in text:
        return "Paths"
    return "Optional[PathLike]" if "Optional" in text or "None" in text else "PathLike"


def parameters_help(model: Type[Request]) -> str:
    """The `Parameters (the command's flags):` section of the API's docstring."""
    import textwrap

    lines = []
    for name, info in model.model_fields.items():
        spec = model.spec(name)
        where = f"{spec['metavar']}: " if spec["argument"] else f"{', '.join(model.flags(name))}: " if spec["cli"] else ""
        default = _default(info)
        shown = "" if default is inspect.Parameter.empty else f"; default {default!r}"
        lines += textwrap.wrap(f"{name:<16} {where}{info.description.rstrip('.')}{shown}", 112, initial_indent=" " * 8,
                               subsequent_indent=" " * 25, break_on_hyphens=False)
    return "\n".join(lines)


def reference_rows(model: Type[Request], command: str) -> List[str]:
    """The README's reference table of a command: flag, API keyword, default, meaning."""
    rows = [f"| `soarpack {command}` | `soarpack.{command.replace('-', '_')}()` | default | meaning |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        spec = model.spec(name)
        flag = spec["metavar"] if spec["argument"] else " ".join(model.flags(name)) if spec["cli"] else "-"
        default = _default(info)
        shown = "" if default is inspect.Parameter.empty else f"`{default!r}`"
        if spec.get("has_cli_default"):
            shown += f" (the command's: `{spec['cli_default']}`)"
        rows.append(f"| `{flag}` | `{name}` | {shown} | {info.description} |")
    return rows


def usage(model: Type[Request], command: str) -> str:
    """`soarpack COMMAND ARGS` as the command's usage line names its arguments (MODEL_DIR OUT, [BUNDLE], RESULTS...)."""
    words = [f"soarpack {command}"]
    for name in model.cli_fields():
        spec = model.spec(name)
        if spec["argument"]:
            word = spec["metavar"] + ("..." if "List" in repr(model.model_fields[name].annotation) else "")
            words.append(word if model.model_fields[name].is_required() or spec["has_cli_default"] else f"[{word}]")
    return " ".join(words)


def api_function(model: Type[Request]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`@api_function(QuantizeRequest)` on `def quantize(request, on_event)`, what the command does with its request:
    the API function of that name, `quantize(*arguments, **options, on_event=None)`, whose arguments are validated
    into the request (a wrong type is one ConfigError naming the keyword) before the body runs (on_event a no-op
    callback when none is given; a body that takes no callback makes a function without `on_event`). The
    command's arguments (MODEL_DIR OUT) are its positional parameters. Its signature, old keyword names
    (DeprecationWarning) and help() come from the model: the body's docstring (summary, what it does, `Returns`,
    `Example`), with the command's usage and the model's Parameters put in."""
    from soarpack.deprecation import renamed_keywords
    from soarpack.steps import EventCallback, no_events

    def derive(run: Callable[..., Any]) -> Callable[..., Any]:
        name = run.__name__
        events = len(inspect.signature(run).parameters) == 2
        extra = [inspect.Parameter("on_event", inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=Optional[EventCallback])] if events else []
        fields = list(model.model_fields)
        positional = next((i for i, n in enumerate(fields) if not model.spec(n)["argument"]), len(fields))
        signature = api_signature(model, positional, extra=extra).replace(
            return_annotation=inspect.signature(run).return_annotation)  # help(): `-> 'QuantizeResult'`

        def function(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:  # a missing or unknown keyword: Python's own words name it
                raise ConfigError(f"soarpack.{name}(): {exc}") from None
            bound.apply_defaults()
            values = dict(bound.arguments)
            if not events:
                return run(model.from_api(name, values))
            on_event = values.pop("on_event") or no_events
            return run(model.from_api(name, values), on_event)

        function.__signature__ = signature  # type: ignore[attr-defined]
        function.__name__ = function.__qualname__ = name
        function.__module__ = run.__module__
        function.__doc__ = _api_doc(model, name, run.__doc__ or "", events)
        return renamed_keywords(**model.renamed())(function)

    return derive


def _api_doc(model: Type[Request], name: str, written: str, events: bool) -> str:
    """The written docstring with the command's usage after its summary and the Parameters before its Returns."""
    paragraphs = written.rstrip().split("\n\n")
    returns = next((i for i, p in enumerate(paragraphs) if p.lstrip().startswith(("Returns", "Example"))),
                   len(paragraphs))
    same = f"    The same as `{usage(model, name.replace('_', '-'))}`."
    body = [same + "\n" + p if i == 1 else p for i, p in enumerate(paragraphs[1:returns], 1)] or [same]
    on_event = "\n        on_event         called with each soarpack.steps.Event" if events else ""
    parameters = (f"    Parameters (the command's flags; {model.__module__}.{model.__name__} declares them):\n"
                  f"{parameters_help(model)}{on_event}")
    return "\n\n".join([paragraphs[0], *body, parameters, *paragraphs[returns:]])
