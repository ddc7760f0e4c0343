"""`soarpack cache list|clear`: what is under soarpack's cache, with sizes, and clearing it (soarpack.cache)."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from soarpack.cli import app, subcommand, sub_app
from soarpack.cli.output import Output, sink

cache_app = sub_app("""See and clear what soarpack keeps under its cache folder.

The folder is $SOARPACK_CACHE, else $XDG_CACHE_HOME/soarpack, else
~/.cache/soarpack: the image stand-in (about 7 GB), the platform wheels,
gpu-serve extras.

Example:

\b
  soarpack cache list
  soarpack cache clear stale --yes
""")
app.add_typer(cache_app, name="cache")


def _root_line() -> str:
    from soarpack.cache import root_problem
    from soarpack.imagestack import cache_root
    from soarpack.printable import printable

    how = "$SOARPACK_CACHE" if os.environ.get("SOARPACK_CACHE") else \
        "$XDG_CACHE_HOME/soarpack" if os.environ.get("XDG_CACHE_HOME") else "the default, ~/.cache/soarpack"
    problem = root_problem()
    return f"cache: {printable(cache_root())} ({how})" + (f"\n  {printable(problem)}: clear refuses it" if problem else "")


def _rows(entries) -> List[str]:
    from soarpack.cache import listing_lines

    return listing_lines(entries)


@subcommand(cache_app, "list")
def list_cmd() -> Output:
    """Every entry under the cache with its size on disk, and whether a running build or check holds it.

    Example:

    \b
      soarpack cache list
      soarpack --format json cache list
    """
    from soarpack.cache import entries, free_bytes, human
    from soarpack.imagestack import cache_root

    found = entries()
    total, free = sum(e.bytes for e in found), free_bytes()
    lines = [_root_line(), *(_rows(found) or ["  (empty)"]), f"  {human(total):>9}  in all; {human(free)} free there"]
    return Output({"root": str(cache_root()), "entries": [e.to_dict() for e in found], "total_bytes": total,
                "free_bytes": free}, "\n".join(lines))


@subcommand(cache_app, "clear")
def clear_cmd(
    what: Optional[List[str]] = typer.Argument(None, metavar="[WHAT]...", show_default=False,
                                               help="all (the default), stale, a group (image-stack, wheels, "
                                                    "gpu-serve) or an entry as cache list names it."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
) -> Output:
    """Delete entries of the cache; they are made again when needed.

    Without --yes it lists what it would delete and asks on a terminal;
    elsewhere (a script, CI, --format json) it deletes nothing and says so:
    the image stand-in takes minutes and about 4 GB of downloads to rebuild.
    It refuses, deleting nothing, while a running build or check uses an
    entry, and names the process. Only entries that hold soarpack's marker
    (written when soarpack made them) are deleted: anything else under the
    cache folder is left, with the command that removes it by hand (exit 1),
    and a cache folder that is /, your home or a parent of either is refused.

    \b
      stale  image stand-ins this soarpack no longer uses (older pins), and
             the leftovers of an interrupted clear

    Example:

    \b
      soarpack cache clear stale
      soarpack cache clear image-stack --yes
    """
    from soarpack.cache import clear, entries, human, kept_lines, refuse_unsafe_root, select

    out = sink()
    refuse_unsafe_root()  # before anything under it is even listed
    chosen = select(entries(), what or [])
    total = sum(e.bytes for e in chosen)
    data = {"entries": [e.to_dict() for e in chosen], "bytes": total}
    if not chosen:
        return Output({**data, "deleted": False, "dry_run": False}, "nothing to clear")
    listing = "\n".join([_root_line(), *_rows(chosen), f"  {human(total):>9}  in all"])
    if not yes:
        if out.json or not sys.stdin.isatty():
            return Output({**data, "deleted": False, "dry_run": True},
                              f"{listing}\nnothing deleted (a dry run): add --yes to delete these")
        typer.echo(listing)
        if not typer.confirm(f"delete these {len(chosen)} ({human(total)})?", default=False, err=True):
            return Output({**data, "deleted": False, "dry_run": False}, "nothing deleted")
        listing = None
    cleared = clear(chosen)
    freed = sum(e.bytes for e in cleared.deleted)
    done = "\n".join([f"deleted {len(cleared.deleted)} cache entr{'y' if len(cleared.deleted) == 1 else 'ies'}, "
                      f"{human(freed)} freed", *kept_lines(cleared.kept)])
    return Output({**data, "deleted": bool(cleared.deleted), "dry_run": False,
                   "kept": [e.to_dict() for e in cleared.kept]}, done if listing is None else f"{listing}\n{done}",
                  exit_code=1 if cleared.kept else 0)
