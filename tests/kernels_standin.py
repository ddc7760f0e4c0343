"""A stand-in GPU backend for `soarpack kernels` (SOARPACK_KERNELS_BACKEND=kernels_standin:backend): times from a
simple model of each route, so the library's table, roll-up and thresholds can be checked without a GPU. It is NOT
a measurement; it stands in for soarpack.kernels.cuda.CudaBackend, which the CPU tests cannot run (nor sgl_kernel)."""

from __future__ import annotations

CALLS = []


class StandIn:
    def __init__(self, marlin_ext=None, crossover=256, read_gbps=4000.0, fp8_crossover=128):
        self.crossover, self.read_gbps, self.marlin_ext = crossover, read_gbps, marlin_ext
        self.fp8_crossover = fp8_crossover

    def describe(self):
        return {"device": "stand-in", "torch": "none", "marlin": "stand-in sgl_kernel", "triton": True,
                "fp8": "stand-in fp8_scaled_mm + sgl_per_token_quant_fp8"}

    def _fp8(self, n, k, m, w4_best):
        """FP8 route: per-token quantization (read bf16, write e4m3) + a GEMM reading 1 byte a weight at twice
        bf16's rate; the crossover with the W4 routes is placed at self.fp8_crossover, like Marlin's above."""
        quant = 2.0 + m * k * 3 / (self.read_gbps * 1e3)
        gemm = 6.0 + n * k / (self.read_gbps * 1e3 * 0.8) + m * n * k * 2e-9 * 0.5
        fp8 = quant + gemm
        if w4_best is not None:
            fp8 = max(fp8, w4_best * 1.25) if m < self.fp8_crossover else min(fp8, w4_best * 0.8)
        return {"fp8_us": fp8, "fp8_quant_us": quant, "fp8_gemm_us": fp8 - quant, "fp8_err": 3.8e-2}

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
                row.update(self._fp8(n, k, m, min(marlin, dequant)))
                route = "fp8" if m >= 256 and (n, k) != (4608, 4096) else "dequant" if m >= 256 else "marlin"
                row.update(fp8_dispatch_us=row[f"{route}_us"], fp8_route=route)
            else:
                row.update(self._fp8(n, k, m, None))
            out[m] = row
        return out


def backend(marlin_ext=None):
    return StandIn(marlin_ext=marlin_ext)
