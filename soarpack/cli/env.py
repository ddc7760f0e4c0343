"""`soarpack env`: this machine as soarpack sees it (soarpack.envinfo), for a bug report or a first look."""

from __future__ import annotations

import typer

from soarpack.cli import command
from soarpack.cli.output import Output


@command("env")
def env_cmd(
    no_sizes: bool = typer.Option(False, "--no-sizes", help="Skip measuring the cache (a big one takes seconds)."),
) -> Output:
    """Versions, the Python 3.10 found, the image stand-in, the cache and disk.

    The versions of soarpack, Python, torch, transformers and gptqmodel
    installed here (read from their metadata, nothing imported); the
    CPython 3.10 that check and build use and how it was found
    ($SOARPACK_PYTHON310 sets it); whether the image stand-in is built,
    where, and its key; the cache's entries with their sizes
    ($SOARPACK_CACHE moves it) and the disk free there.

    Example:

    \b
      soarpack env
      soarpack --format json env
    """
    from soarpack.cache import human
    from soarpack.envinfo import report

    data = report(sizes=not no_sizes)
    v, py, stack, cache = data["versions"], data["python310"], data["image_stand_in"], data["cache"]
    lines = ["versions: " + ", ".join(f"{k} {v[k] or 'not installed'}" for k in v), f"python: {data['executable']}"]
    if py["path"]:
        lines.append(f"python 3.10: {py['path']} (found by {py['found_by']}; the order: {', '.join(py['searched'])})")
    else:
        lines.append(f"python 3.10: none found (searched {', '.join(py['searched'])}); "
                     "set SOARPACK_PYTHON310=/path/to/python3.10")
    if py["note"]:
        lines.append(f"  note: {py['note']}")
    state = "built" if stack["built"] else "not built (the first check builds it: about 4 GB, 3 minutes)"
    lines.append(f"image stand-in: {state}, key {stack['key']}, at {stack['path']}")
    if stack["versions"]:
        vv = stack["versions"]
        lines.append(f"  runs Python {vv.get('python')}, torch {vv.get('torch')}, transformers {vv.get('transformers')}")
    for holder in stack["in_use_by"]:
        lines.append(f"  in use by {holder}")
    set_by = {"SOARPACK_CACHE": "$SOARPACK_CACHE", "XDG_CACHE_HOME": "$XDG_CACHE_HOME/soarpack"}.get(cache["set_by"], "default")
    lines.append(f"cache: {cache['root']} ({set_by})" + ("" if no_sizes else f", {human(cache['total_bytes'])} in all")
                 + f", {human(cache['free_bytes'])} free there")
    for e in cache["entries"]:
        size = "" if no_sizes else f"{human(e['bytes']):>9}  "
        lines.append(f"  {size}{e['name']}" + (f"  [{e['note']}]" if e["note"] else ""))
    return Output(data, "\n".join(lines))
