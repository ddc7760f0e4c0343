"""A tiny step runner: a step declares its name, what it needs and whether it gates an upload; the runner decides.

A step is a function of a shared context returning `Done(line, data, versions)` (or just the line); it raises
StepSkipped or StepFailed (or any SoarpackError) with its one line. The runner times each step, skips the
dependants of a step that did not pass with a reason derived from `needs` (never listed by hand), and hands every
event to one callback. Libraries emit `Event`s and never print; the CLI renders them (soarpack.cli.output).

Two ways to run the same steps:
- a rehearsal (`check`): every step gets a result, a failed one included, and the report is the outcome;
- a pipeline (`quantize`, `build`: `stop_at_failure=True`): the first step that fails ends the run, its error raised
  as it is (the command's one `error:` line); a skipped step still skips its dependants.
A step that raises out of the run (a pipeline's failure, a Ctrl-C, a bug) ends with an "end" event that says how
(`failed`, `interrupted`) and carries no result. `announce=False`: no "start"/"end" events, for a command whose
steps say their own lines (`build`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from soarpack.errors import HostError, SoarpackError

PASS, FAIL, SKIP = "pass", "fail", "skip"


class StepFailed(Exception):
    def __init__(self, detail: str, **data: Any):
        super().__init__(detail)
        self.data = data


class StepSkipped(StepFailed):
    pass


@dataclass(frozen=True)
class Done:
    detail: str
    data: Dict[str, Any] = field(default_factory=dict)
    versions: Optional[Dict[str, str]] = None  # what the interpreter that ran the step reported


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Any], Union[Done, str, None]]
    needs: Tuple[str, ...] = ()  # steps that must have passed first; else this one is skipped
    gates: bool = False  # must pass for the result to count (the upload gate)


def step(name: str, *, needs: Sequence[str] = (), gates: bool = False) -> Callable[[Callable], Step]:
    """Declare a step: `@step("verify", needs=["prepare_model.sh"], gates=True)` over `def verify(ctx)`."""
    return lambda fn: Step(name, fn, tuple(needs), gates)


@dataclass
class StepResult:
    name: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    versions: Optional[Dict[str, str]] = None
    data: Dict[str, Any] = field(default_factory=dict)
    gates: bool = False
    needs: Tuple[str, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        return {**asdict(self), "needs": list(self.needs)}


@dataclass(frozen=True)
class Event:
    """The one progress event: a step or phase starts or ends, says a line, or counts progress."""

    kind: str  # "start" | "end" | "info" | "problem" | "progress"
    phase: str  # the step or phase it is about
    message: str = ""
    seconds: float = 0.0
    done: int = 0
    total: int = 0
    result: Optional[StepResult] = None  # on a runner step's "end"
    data: Any = None  # what a "progress" event is about (an eval row's record)


EventCallback = Callable[[Event], None]


def no_events(event: Event) -> None:
    """The default callback of every library function: silence."""


@dataclass(frozen=True)
class Risk:
    """A finding beside the steps (what is known about the score, say): printed by the verdict, read by the gate.
    soarpack.bundle.risks computes a bundle's; `source` says where its evidence is written down."""

    name: str  # what --accept-risk takes
    message: str
    source: str = ""
    blocks: bool = False  # the gate fails unless it is accepted

    def line(self) -> str:
        return f"risk {self.name}: {self.message}" + (f" ({self.source})" if self.source else "")

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "message": self.message, "source": self.source, "blocks": self.blocks}


@dataclass
class RunReport:
    steps: List[StepResult] = field(default_factory=list)
    versions: Dict[str, str] = field(default_factory=dict)  # the interpreter that ran the runner
    risks: List[Risk] = field(default_factory=list)

    def __getitem__(self, name: str) -> StepResult:
        return next(s for s in self.steps if s.name == name)

    def status(self) -> Dict[str, str]:
        return {s.name: s.status for s in self.steps}

    @property
    def ok(self) -> bool:
        return all(s.status != FAIL for s in self.steps)

    def gate(self) -> Dict[str, List[str]]:
        """What keeps the result from counting: failed steps, gating steps that did not run, blocking risks."""
        return {"failed": [s.name for s in self.steps if s.status == FAIL],
                "not_run": [s.name for s in self.steps if s.gates and s.status == SKIP],
                "risks": [r.name for r in self.risks if r.blocks]}


def interpreter_versions() -> Dict[str, str]:
    from soarpack.version import __version__

    return {"python": sys.version.split()[0], "executable": sys.executable, "soarpack": __version__}


class Runner:
    def __init__(self, steps: Sequence[Step], on_event: EventCallback = no_events, *, stop_at_failure: bool = False,
                 announce: bool = True):
        seen: set = set()
        for s in steps:
            unknown = [n for n in s.needs if n not in seen]
            if s.name in seen or unknown:
                raise ValueError(f"step {s.name!r}: " + (f"needs {unknown}, not declared before it" if unknown else "declared twice"))
            seen.add(s.name)
        self.steps, self.on_event = list(steps), on_event
        self.stop_at_failure, self.announce = stop_at_failure, announce

    def say(self, phase: str, message: str) -> None:
        self.on_event(Event("info", phase, message))

    def _announce(self, event: Event) -> None:
        if self.announce:
            self.on_event(event)

    def run(self, ctx: Any, report: Optional[RunReport] = None) -> RunReport:
        report = report if report is not None else RunReport()
        report.versions = interpreter_versions()
        done: Dict[str, StepResult] = {}
        for s in self.steps:
            blocked = next((done[n] for n in s.needs if done[n].status != PASS), None)
            if blocked is not None:
                root = done[blocked.data.get("cause", blocked.name)]  # the step that failed or skipped itself
                why = "failed" if root.status == FAIL else f"was skipped: {root.detail}"
                detail = f"needs {blocked.name}, which {why}" if root is blocked else f"needs {blocked.name}; {root.name} {why}"
                result = StepResult(s.name, SKIP, detail, gates=s.gates, needs=s.needs,
                                    data={"blocked_by": blocked.name, "cause": root.name})
            else:
                self._announce(Event("start", s.name))
                result = self._run_one(s, ctx)
            done[s.name] = result
            report.steps.append(result)
            self._announce(Event("end", s.name, result.detail, result.seconds, result=result))
        return report

    def _run_one(self, s: Step, ctx: Any) -> StepResult:
        t0 = time.monotonic()
        status, versions, data = PASS, None, {}
        try:
            out = s.run(ctx)
            done = out if isinstance(out, Done) else Done(out or "")
            detail, versions, data = done.detail, done.versions, dict(done.data)
        except StepSkipped as exc:
            status, detail, data = SKIP, str(exc), dict(exc.data)
            versions = data.pop("versions", None)
        except StepFailed as exc:
            self._raise_in_a_pipeline(s, t0, exc)
            status, detail, data = FAIL, str(exc), dict(exc.data)
            versions = data.pop("versions", None)
        except HostError as exc:
            # this machine cannot run the step (a read-only cache, say): not a failure of what is checked
            self._ended_by(s, t0, exc)
            raise
        except SoarpackError as exc:
            self._raise_in_a_pipeline(s, t0, exc)
            status, detail = FAIL, str(exc)
        except BaseException as exc:
            self._ended_by(s, t0, exc)
            raise
        return StepResult(s.name, status, detail, round(time.monotonic() - t0, 2), versions, data, s.gates, s.needs)

    def _raise_in_a_pipeline(self, s: Step, t0: float, exc: BaseException) -> None:
        if self.stop_at_failure:
            self._ended_by(s, t0, exc)
            raise exc

    def _ended_by(self, s: Step, t0: float, exc: BaseException) -> None:
        how = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        self._announce(Event("end", s.name, how, round(time.monotonic() - t0, 2)))


def lines_to(on_event: EventCallback, phase: str, kind: str = "info") -> Callable[[str], None]:
    """A `log(str)` for code that says lines, turned into events of `phase`."""
    return lambda message: on_event(Event(kind, phase, message))
