"""One-time GPU compiles started in background threads while calibration rows are tokenized and weights load.

- GPTQModel's CUDA block-update extension: a ~30 s nvcc build the first GPTQ layer would otherwise wait for. Until
  it is built GPTQ uses GPTQModel's eager block update, bit-identical (engine.eager_block_update_while), and a
  failed build leaves GPTQModel on that torch path: the run goes on, with one line saying so.
- fla's Triton kernels, when fla was asked for (SOARPACK_GLA_BACKEND=fla; the default torch GLA compiles nothing):
  compiled and autotuned once for the Lightning layers' shapes and dtypes, so the sanity forward (which waits for
  this first: two concurrent first calls would both autotune) finds them ready.

On a CPU there is nothing to compile: no thread starts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

WarmupFn = Callable[[], Optional[str]]  # returns None when ready, else one line saying why not


@dataclass
class Warmups:
    threads: Dict[str, threading.Thread] = field(default_factory=dict)
    outcomes: Dict[str, Optional[str]] = field(default_factory=dict)

    def start(self, name: str, fn: WarmupFn) -> None:
        def work() -> None:
            try:
                self.outcomes[name] = fn()
            except Exception as exc:  # noqa: BLE001 — a failed warm-up must never fail the run
                self.outcomes[name] = f"{name} warm-up failed ({type(exc).__name__}: {exc}"[:300] + ")"

        thread = threading.Thread(target=work, name=f"soarpack-warmup-{name}", daemon=True)
        self.threads[name] = thread
        thread.start()

    def wait(self, name: str) -> Optional[str]:
        """Wait for `name` (if it was started); its failure line, or None."""
        thread = self.threads.pop(name, None)
        if thread is None:
            return None
        thread.join()
        return self.outcomes.get(name)

    def wait_all(self) -> List[str]:
        return [line for name in list(self.threads) if (line := self.wait(name))]


def start_warmups(device: str, config, gla_backend: str) -> Warmups:
    """The background compiles worth starting for a run on `device` (none on a CPU)."""
    warmups = Warmups()
    if not device.startswith("cuda"):
        return warmups
    from soarpack.quant import engine
    from soarpack.sala.gla import fla_available, warm_up_fla

    warmups.start("gptq-block-update", engine.build_block_update)
    if gla_backend == "fla" and config.lightning_layer_ids and fla_available():
        def fla() -> None:
            warm_up_fla(device, config.lightning_nh, config.lightning_head_dim)
        warmups.start("fla", fla)
    return warmups
