"""The XLA options a rewritten module needs on a backend to overlap its rings.

By default XLA's GPU pipeline merges the two chains of a reduce_scatter ring, their
permutes (CollectivePermuteCombiner, up to 30 MiB) and their dots that share an
operand (DotMerger), so the merged permute waits for the merged dot and overlaps
nothing; and its latency-hiding scheduler keeps one collective in flight, so one of a
two-stream ring's two permutes is made synchronous. TPU needs none: its latency-hiding
scheduler and asynchronous permutes are the default.
"""
from __future__ import annotations

GPU_SCHEDULER = {"xla_gpu_enable_latency_hiding_scheduler": True}
GPU_RING_FLAGS = {"xla_gpu_collective_permute_combine_threshold_bytes": 0,
                  "xla_gpu_dot_merger_threshold_mb": 0,
                  "xla_gpu_experimental_parallel_collective_overlap_limit": 2}
GPU_PLATFORMS = ("cuda", "rocm", "gpu")


def ring_options(platforms) -> dict:
    """The compiler options a module with rings needs on `platforms` (JAX's names)."""
    if any(p in GPU_PLATFORMS for p in platforms):
        return {**GPU_SCHEDULER, **GPU_RING_FLAGS}
    return {}


def as_xla_flags(options: dict) -> str:
    """`options` as an XLA_FLAGS value (--name=value, booleans lower case)."""
    def text(value):
        return str(value).lower() if isinstance(value, bool) else str(value)

    return " ".join(f"--{name}={text(value)}" for name, value in options.items())
