import os

# Eight host CPU devices for every test; must be set before jax is imported.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

# libtpu (python -m overlap_hlo.targets.tpu_plugin install) is for
# tests/targets/test_tpu*.py, which compile for TPU ahead of time without a TPU backend.
# Every other JAX process here (this one and its subprocesses) stays on the CPU, so none
# loads a libtpu that JAX finds by itself (jax[tpu] in site-packages), prints its
# warnings or takes its lock file.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Every ring cloned from a template is checked against a fresh build of the same site
# (overlap_hlo/rewrite/templates.py), here and in the CLI subprocesses.
os.environ.setdefault("OVERLAP_HLO_CHECK_TEMPLATES", "1")
