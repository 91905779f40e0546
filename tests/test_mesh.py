"""Meshes: parsing, concrete meshes with explicit axis types, abstract meshes of any size."""

import jax
import pytest
from jax.sharding import AxisType

import workbench as wb


def test_parse_forms_agree():
    expected = wb.MeshShape(("data", "model"), (4, 2))
    assert wb.parse_mesh("data=4,model=2") == expected
    assert wb.parse_mesh(" data = 4 , model=2 ") == expected
    assert wb.parse_mesh({"data": 4, "model": 2}) == expected
    assert wb.parse_mesh((4, 2), names=("data", "model")) == expected
    assert wb.parse_mesh(8, names="data") == wb.MeshShape(("data",), (8,))
    assert wb.parse_mesh(wb.layout.abstract_mesh("data=4,model=2")) == expected
    assert str(expected) == "data=4,model=2" and expected.size == 8


@pytest.mark.parametrize("kind, jax_type", [("explicit", AxisType.Explicit), ("auto", AxisType.Auto)])
def test_build_mesh_passes_axis_types(kind, jax_type):
    mesh = wb.build_mesh("data=4,model=2", axis_types=kind)
    assert mesh.axis_types == (jax_type, jax_type)
    assert [d.id for d in mesh.devices.flat] == list(range(8))
    assert dict(mesh.shape) == {"data": 4, "model": 2}


def test_build_mesh_on_chosen_devices():
    mesh = wb.build_mesh("model=2", devices=jax.devices()[2:4])
    assert [d.id for d in mesh.devices.flat] == [2, 3]


def test_mixed_axis_types():
    mesh = wb.build_mesh("data=4,model=2", axis_types=("explicit", "auto"))
    assert mesh.axis_types == (AxisType.Explicit, AxisType.Auto)


def test_abstract_mesh_any_size():
    mesh = wb.layout.abstract_mesh("data=64,model=16")
    assert mesh.axis_sizes == (64, 16) and mesh.axis_names == ("data", "model")
    assert wb.parse_mesh(mesh).size == 1024
