"""`soarpack diagnose` / `soarpack.diagnose()`: its request, declared once (soarpack.request derives the command's
arguments, the API's signature and help, and the README's rows). `--catalogue`, which lists the catalogue instead
of diagnosing, is the command's own."""

from __future__ import annotations

from soarpack.request import Option, PathList, Request


class DiagnoseRequest(Request):
    paths: PathList = Option(..., argument=True, metavar="LOG_OR_DIR", cli_default=None,
                             help="Log files, soarpack eval/bench JSON, or folders of them.")
