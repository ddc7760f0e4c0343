"""What the platform's GPU answers (one RTX PRO 6000 Blackwell, sm_120), for the stand-ins that impersonate it on
a CPU: the fork check's torch.cuda, Triton driver and Marlin capability check."""

NAME = "NVIDIA RTX PRO 6000 Blackwell (soarpack stand-in)"
CAPABILITY = (12, 0)
TOTAL_MEMORY_BYTES = 96 * 1024**3
MULTIPROCESSORS = 188
L2_CACHE_BYTES = 128 * 1024**2
WARP_SIZE = 32


def as_request() -> dict:
    """The GPU as the fork child's request carries it (the child imports nothing of soarpack)."""
    return {"name": NAME, "capability": list(CAPABILITY), "total_memory": TOTAL_MEMORY_BYTES,
            "multi_processor_count": MULTIPROCESSORS, "L2_cache_size": L2_CACHE_BYTES, "warp_size": WARP_SIZE}
