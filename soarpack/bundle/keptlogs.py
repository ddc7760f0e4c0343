"""A failed rehearsal's logs, kept: `soarpack check` leaves them for `soarpack diagnose DIR` to read.

The rehearsal runs in a temp dir that check removes; when a step failed after prepare_env.sh started writing
logs, the bundle's logs/ (prepare_env.log, prepare_model.log, quantize.log) are copied to a new folder beside the
system's temp files, with the check report as check.json (each failed step's detail holds the last line of what
the step's interpreter printed). With --keep DIR the whole rehearsal stays, and check.json is written into it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional

from soarpack.fsutil import atomic_write_json

KEPT_PREFIX = "soarpack-check-logs-"
REPORT_NAME = "check.json"  # soarpack.diagnose reads it as a check report


def diagnose_command(folder: str) -> str:
    import shlex

    return f"soarpack diagnose {shlex.quote(str(folder))}"


def keep_failed_logs(report, work: Path, root: Path, work_stays: bool) -> Optional[Path]:
    """Where the failed rehearsal's logs now are (None when nothing failed or no rehearsal log was written);
    records it in `report.logs`."""
    logs = root / "logs"
    if report.ok or not logs.is_dir():
        return None
    try:
        if work_stays:
            dest = work
        else:
            dest = Path(tempfile.mkdtemp(prefix=KEPT_PREFIX))
            shutil.copytree(logs, dest / "logs")
        report.logs = str(dest)
        atomic_write_json(dest / REPORT_NAME, report.to_dict())
    except OSError:  # a full or read-only temp dir must not hide the check's own result
        report.logs = None
        return None
    return dest
