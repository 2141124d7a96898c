"""Layer 5, targets: running modules on host CPU devices, compiling for TPU ahead of
time, the compiled schedule's model and the report built on it.

Imports from every layer below, including overlap_hlo.api.
"""
