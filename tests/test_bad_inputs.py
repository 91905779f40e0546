"""Bad input gets a specific exception with one line naming the bad value and a fix.

Each case: (what is called, the exception, fragments the message must contain). The same messages
reach the CLI (one line, exit 2) and the widgets (shown inline).
"""

import pytest

import workbench as wb
from workbench.layout.shapes import parse_dtype, parse_shape

MESH = "data=4,model=2"

CASES = [
    # Meshes
    ("empty mesh", lambda: wb.parse_mesh(""), wb.MeshError, ["empty", "data=8"]),
    ("axis without size", lambda: wb.parse_mesh("data"), wb.MeshError, ["'data'", "no size", "data=4"]),
    ("size missing after =", lambda: wb.parse_mesh("data="), wb.MeshError, ["''", "not a whole number"]),
    ("axis without name", lambda: wb.parse_mesh("=4"), wb.MeshError, ["'=4'", "no name"]),
    ("size zero", lambda: wb.parse_mesh("data=0"), wb.MeshError, ["'data'", "size 0", "at least 1"]),
    ("negative size", lambda: wb.parse_mesh("data=-2"), wb.MeshError, ["size -2", "at least 1"]),
    ("non-integer size", lambda: wb.parse_mesh("data=4.5"), wb.MeshError, ["'4.5'", "not a whole number"]),
    ("word size", lambda: wb.parse_mesh("data=four"), wb.MeshError, ["'four'", "data=4"]),
    ("duplicate axis", lambda: wb.parse_mesh("data=4,data=2"), wb.MeshError, ["'data'", "twice", "different name"]),
    ("invalid axis name", lambda: wb.parse_mesh("1data=2"), wb.MeshError, ["'1data'", "not a valid name"]),
    ("axis name with space", lambda: wb.parse_mesh("my axis=2"), wb.MeshError, ["'my axis'", "not a valid name"]),
    ("reserved axis name", lambda: wb.parse_mesh("None=2"), wb.MeshError, ["'None'", "reserved"]),
    ("double comma", lambda: wb.parse_mesh("data=4,,model=2"), wb.MeshError, ["empty axis", "data=4,model=2"]),
    ("float size in dict", lambda: wb.parse_mesh({"data": 2.5}), wb.MeshError, ["2.5", "whole number"]),
    ("names and sizes differ", lambda: wb.parse_mesh((2, 4), names=("data",)), wb.MeshError,
     ["2 size(s)", "1 name(s)"]),
    ("no axes", lambda: wb.parse_mesh({}), wb.MeshError, ["no axes", "data=8"]),
    ("wrong type", lambda: wb.parse_mesh(3.5), wb.MeshError, ["3.5", "data=4,model=2"]),
    ("too many devices", lambda: wb.build_mesh("data=4,model=4"), wb.MeshError,
     ["needs 16 devices", "JAX has 8", "abstract_mesh", "WORKBENCH_CPU_DEVICES=16"]),
    ("too few devices", lambda: wb.build_mesh("data=2"), wb.MeshError,
     ["needs 2 devices", "devices=jax.devices()[:2]"]),
    ("unknown axis type", lambda: wb.build_mesh("data=8", axis_types="manual"), wb.MeshError, ["'manual'", "explicit"]),
    ("axis types count", lambda: wb.layout.abstract_mesh("data=4,model=2", axis_types=("auto",)), wb.MeshError,
     ["1 axis type", "one per axis"]),
    # Specs: text
    ("empty spec entry", lambda: wb.parse_spec("data,,model"), wb.SpecError, ["'data,,model'", "empty entry", "None"]),
    ("unclosed bracket", lambda: wb.parse_spec("(data, model"), wb.SpecError, ["'(data, model'", "closing bracket"]),
    ("unmatched bracket", lambda: wb.parse_spec("data)"), wb.SpecError, ["'data)'", "unmatched"]),
    ("missing comma", lambda: wb.parse_spec("data model"), wb.SpecError, ["'data model'", "comma before 'model'"]),
    ("bad character", lambda: wb.parse_spec("data; model"), wb.SpecError, ["'data; model'", "at ';"]),
    ("None inside a group", lambda: wb.parse_spec("(data, None), model"), wb.SpecError, ["None inside an axis group"]),
    ("nested groups", lambda: wb.parse_spec("((data, (model, x)),)"), wb.SpecError, ["nests brackets"]),
    ("P without bracket", lambda: wb.parse_spec("P data"), wb.SpecError, ["'P data'", "P('data', None)"]),
    ("text after P(...)", lambda: wb.parse_spec("P(data) model"), wb.SpecError, ["after the closing"]),
    ("python code", lambda: wb.parse_spec("__import__('os').getcwd()"), wb.SpecError, ["__import__"]),
    # Specs: against a mesh and a shape
    ("unknown axis", lambda: wb.layout.validate_spec("batch", MESH, (8,)), wb.SpecError,
     ["'batch'", "does not have", "data, model"]),
    ("axis used twice", lambda: wb.layout.validate_spec("data, data", MESH, (8, 8)), wb.SpecError,
     ["'data'", "dimensions 0 and 1", "once"]),
    ("axis twice in a group", lambda: wb.layout.validate_spec("(data, data)", MESH, (8, 8)), wb.SpecError, ["'data'"]),
    ("too many entries", lambda: wb.layout.validate_spec("data, None, model", MESH, (8, 16)), wb.SpecError,
     ["3 entries", "2 dimension(s)", "(8, 16)", "drop the last 1"]),
    ("spec on a scalar", lambda: wb.layout.validate_spec("data", MESH, ()), wb.SpecError,
     ["1 entries", "0 dimension(s)"]),
    ("indivisible dimension", lambda: wb.layout.validate_spec("data", MESH, (10,)), wb.SpecError,
     ["dimension 0 of size 10", "mesh axis 'data' (4)", "pad it to 12", "None"]),
    ("indivisible over two axes", lambda: wb.layout.validate_spec("None, (data, model)", MESH, (3, 12)), wb.SpecError,
     ["dimension 1 of size 12", "'data'=4", "'model'=2", "product 8", "pad it to 16"]),
    ("non-string axis", lambda: wb.layout.validate_spec(wb.layout.spec_from_json(["data"]).__class__(3), MESH, (8,)),
     wb.SpecError, ["3"]),
    ("bad JSON entry", lambda: wb.layout.spec_from_json([3]), wb.SpecError, ["3", "axis name"]),
    # Shapes and dtypes
    ("negative shape", lambda: parse_shape("8,-1"), wb.ShapeError, ["'8,-1'", "'-1'"]),
    ("word in shape", lambda: parse_shape("8,a"), wb.ShapeError, ["'8,a'", "'a'", "8,16,32"]),
    ("fractional shape", lambda: parse_shape("8.5"), wb.ShapeError, ["'8.5'"]),
    ("unknown dtype", lambda: parse_dtype("float33"), wb.DTypeError, ["'float33'", "bfloat16"]),
    ("dtype typo", lambda: wb.layout_array((8,), "data=8", "data", dtype="bf16x"), wb.DTypeError, ["'bf16x'"]),
    # Rule tables and trees
    ("invalid regex", lambda: wb.layout.RuleTable([("(kernel", "data")]), wb.RuleError,
     ["'(kernel'", "not a valid regex"]),
    ("rule line without arrow", lambda: wb.layout.RuleTable.parse("kernel: data"), wb.RuleError,
     ["'kernel: data'", "=>"]),
    ("rule with bad spec", lambda: wb.layout.RuleTable([("kernel", "data,,")]), wb.RuleError,
     ["rule 0", "'kernel'", "empty entry"]),
    ("unknown strategy", lambda: wb.layout_tree({}, "data=8", "shard-everything"), wb.WorkbenchError,
     ["'shard-everything'", "'replicate', 'shard'"]),
    ("shard without data axis", lambda: wb.layout_tree({}, "model=8", "shard"), wb.MeshError,
     ["no axis 'data'", "model"]),
]


@pytest.mark.parametrize("call, error, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_message(call, error, fragments):
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, "messages are one line (the CLI prints them as they are)"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    assert isinstance(caught.value, ValueError)


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30
