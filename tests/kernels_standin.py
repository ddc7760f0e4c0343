"""A stand-in GPU backend for `soarpack kernels` (SOARPACK_KERNELS_BACKEND=kernels_standin:backend): times from a
simple model of each route, so the library's table, roll-up and thresholds can be checked without a GPU. It is NOT
a measurement; it stands in for soarpack.kernels.cuda.CudaBackend, which the CPU tests cannot run (nor sgl_kernel)."""

from __future__ import annotations

CALLS = []


class StandIn:
    def __init__(self, marlin_ext=None, crossover=256, read_gbps=4000.0):
        self.crossover, self.read_gbps, self.marlin_ext = crossover, read_gbps, marlin_ext

    def describe(self):
        return {"device": "stand-in", "torch": "none", "marlin": "stand-in sgl_kernel", "triton": True}

    def ceilings(self):
        return {"read_GBps": self.read_gbps}

    def measure(self, n, k, bits, ms):
        CALLS.append((n, k, bits, tuple(ms)))
        out = {}
        for m in ms:
            bf16 = 5.0 + n * k * 2 / (self.read_gbps * 1e3) + m * n * k * 2e-9
            row = {"bf16_us": bf16, "bf16_err": 2.4e-3}
            if bits:
                marlin = 4.0 + n * k * bits / 8 / (self.read_gbps * 1e3 * 0.5) + m * n * k * 2e-9 * 2.2
                dequant = bf16 + n * k * 2 / (self.read_gbps * 1e3) + 2.0
                # the crossover lands exactly at self.crossover: Marlin pays a step there
                if m >= self.crossover:
                    marlin = max(marlin, dequant * 1.5)
                else:
                    marlin = min(marlin, dequant * 0.5)
                row.update(marlin_us=marlin, dequant_us=dequant, marlin_err=2.2e-3, dequant_err=2.2e-3,
                           dispatch_us=marlin if m < 256 else dequant)
                if bits == 4 and m <= 16:
                    row.update(splitk_us=marlin * 0.8, splitk_err=2.0e-3)
            out[m] = row
        return out


def backend(marlin_ext=None):
    return StandIn(marlin_ext=marlin_ext)
