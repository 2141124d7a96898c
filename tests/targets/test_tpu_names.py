"""TPU slice names: GENERATION:SHAPE as JAX spells it, and Cloud TPU's accelerator types
(v5e-8, v5p-16, ...) mapped to the shape Google's TPU pages give them. The mapping
needs no libtpu; the slices described are checked where libtpu is installed."""
import pytest

from overlap_hlo.targets import tpu, tpu_plugin


@pytest.mark.parametrize("name, slice_name", [
    ("v5e-8", "v5e:2x4"),      # v5e and v6e count chips
    ("v6e-8", "v6e:2x4"),
    ("v5e-4", "v5e:2x2"),
    ("v6e-256", "v6e:16x16"),
    ("v5litepod-16", "v5e:4x4"),   # v5e's name in the Cloud TPU API
    ("v4-8", "v4:2x2x1"),      # v4 and v5p count TensorCores, two per chip
    ("v4-32", "v4:2x2x4"),
    ("v5p-16", "v5p:2x2x2"),
    ("v5p-8", "v5p:2x2x1"),
    ("v5p-128", "v5p:4x4x4"),
    ("V5E-8", "v5e:2x4"),
    ("v5e:2x4", "v5e:2x4"),    # a shape stays as it is
    ("V5P:4x4x4", "v5p:4x4x4"),
])
def test_accelerator_types_name_the_documented_shape(name, slice_name):
    assert tpu.slice_name(name) == slice_name


@pytest.mark.parametrize("name, message", [
    ("v5e-12", "v5e-N takes N in 1, 4, 8, 16, 32, 64, 128, 256 (chips)"),
    ("v5p-4", "v5p-N takes N in 8, 16, 32,"),
    ("v4-6", "(TensorCores, two per chip)"),
    ("v9x:2x2", "unknown TPU topology 'v9x:2x2'"),
    ("v3-8", "unknown TPU topology 'v3-8'"),
    ("h100:8", "unknown TPU topology 'h100:8'"),
    ("v5e", "unknown TPU topology 'v5e'"),
    ("v5e:", "unknown TPU topology"),
    ("v5e:2xx4", "unknown TPU topology"),
    ("", "unknown TPU topology"),
])
def test_other_names_are_unknown(name, message):
    with pytest.raises(tpu.UnknownTopology) as raised:
        tpu.slice_name(name)
    assert message in str(raised.value)
    assert "v5e-8" in str(raised.value) or "takes N in" in str(raised.value)


needs_libtpu = pytest.mark.skipif(not tpu_plugin.available(),
                                  reason="libtpu is not installed: no TPU compiler")


@needs_libtpu
@pytest.mark.parametrize("name, slice_name, chips", [
    ("v5e-8", "v5e:2x4", 8), ("v6e-8", "v6e:2x4", 8),
    ("v5p-16", "v5p:2x2x2", 8), ("v4-8", "v4:2x2x1", 4),
])
def test_an_accelerator_type_describes_its_slice(name, slice_name, chips, monkeypatch):
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topo = tpu.topology(name)
    assert (topo.name, topo.requested, topo.label) == (slice_name, name,
                                                        f"{name} ({slice_name})")
    assert topo.devices == tpu.topology(slice_name).devices
    assert tpu.topology(slice_name).requested == ""
    extents = topo.links.extents
    assert len({tuple(d.coords)[:len(extents)] for d in topo.devices}) == chips
