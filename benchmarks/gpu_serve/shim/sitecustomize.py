# On PYTHONPATH, every interpreter of the server (the spawned scheduler and detokenizer too) installs the shim.
# SOARPACK_GPU_SHIM=0 turns it off. See benchmarks/gpu_serve/README.md.
import os

if os.environ.get("SOARPACK_GPU_SHIM", "1") != "0":
    import soarpack_gpu_shim

    soarpack_gpu_shim.install()
