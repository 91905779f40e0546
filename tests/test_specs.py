"""Partition spec text: parsing without eval, formatting back, validation against mesh and shape."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import workbench as wb


@pytest.mark.parametrize(
    "text, expected",
    [
        ("data, None", P("data", None)),
        ("('data', None)", P("data", None)),
        ('("data", None)', P("data", None)),
        ("P('data', 'model')", P("data", "model")),
        ("PartitionSpec('data', 'model')", P("data", "model")),
        ("(data, model), None", P(("data", "model"), None)),
        ("[data, model], none", P(("data", "model"), None)),
        ("((data, model),)", P(("data", "model"))),
        ("P((data, model))", P(("data", "model"))),
        ("(data)", P("data")),
        ("data,", P("data")),
        ("None, -, null, model", P(None, None, None, "model")),
        ("", P()),
        ("   ", P()),
        ("P()", P()),
        ("()", P()),
        ("data, (), model", P("data", None, "model")),
        ("  data ,model  ", P("data", "model")),
    ],
)
def test_parse_spec(text, expected):
    assert wb.parse_spec(text) == expected


def test_parse_never_evaluates():
    # Python expressions are rejected as text, not run.
    with pytest.raises(wb.SpecError):
        wb.parse_spec("__import__('os').system('echo hacked')")
    with pytest.raises(wb.SpecError):
        wb.parse_spec("data + model")


AXES = st.sampled_from(["data", "model", "x", "y_2"])
ENTRY = st.one_of(st.none(), AXES, st.lists(AXES, min_size=2, max_size=3, unique=True).map(tuple))


@given(st.lists(ENTRY, max_size=5))
def test_format_round_trips(entries):
    spec = P(*entries)
    for style in ("short", "code"):
        assert wb.parse_spec(wb.layout.format_spec(spec, style)) == spec
    assert wb.layout.spec_from_json(wb.layout.spec_to_json(spec)) == spec


def test_format_examples():
    assert wb.layout.format_spec(P("data", None, "model")) == "data, None, model"
    assert wb.layout.format_spec(P(("data", "model"),)) == "(data, model),"
    assert wb.layout.format_spec(P()) == "P()"
    assert wb.layout.format_spec(P(("data", "model"), None), "code") == "P(('data', 'model'), None)"
    assert wb.layout.spec_to_json(P("data", None, ("a", "b"))) == ["data", None, ["a", "b"]]


def test_bracketed_axes_for_a_1d_array_suggest_the_trailing_comma_and_the_suggestion_fits():
    # '(data, model)' is the whole spec (one axis per dimension); '(data, model),' groups both on dimension 0.
    assert wb.parse_spec("(data, model)") == P("data", "model")
    assert wb.parse_spec("(data, model),") == P(("data", "model"))
    with pytest.raises(wb.SpecError) as caught:
        wb.layout.validate_spec("(data, model)", "data=4,model=2", (16,))
    message = str(caught.value)
    assert message.startswith("spec P('data', 'model') has 2 entries but the array has 1 dimension(s) (shape (16,))")
    assert "'(data, model)' is read as the whole spec, one entry per dimension" in message
    assert ("write '(data, model),' (the trailing comma makes the brackets one entry), or drop the last 1 entry"
            in message)
    suggested = message.split("write ")[1].split(" (the trailing comma")[0].strip("'")
    assert wb.layout.validate_spec(suggested, "data=4,model=2", (16,)) == P(("data", "model"))
    assert wb.layout_array((16,), "data=4,model=2", suggested).shard_shape == (2,)
    # layout_array passes the text through, so its message (the CLI's, the widget's) says the same.
    with pytest.raises(wb.SpecError, match=r"write '\(data, model\),'"):
        wb.layout_array((16,), "data=4,model=2", "(data, model)")


@pytest.mark.parametrize(
    "spec, shape",
    [
        ("data, model", (16,)),  # no brackets: the user wrote two entries
        ("P('data', 'model')", (16,)),  # P(...) holds the argument list, also two entries
        ("(data, None)", (16,)),  # None cannot join an axis group
        ("(data, model)", (10,)),  # grouped, dimension 0 would not divide by 8: no fix to offer
        ("(data, model)", ()),  # a scalar has no dimension 0
    ],
)
def test_too_many_entries_suggests_the_trailing_comma_only_where_it_fits(spec, shape):
    with pytest.raises(wb.SpecError, match=r"drop the last \d entr") as caught:
        wb.layout.validate_spec(spec, "data=4,model=2", shape)
    assert "trailing comma" not in str(caught.value)


def test_validate_accepts_good_specs():
    assert wb.layout.validate_spec("data, None", "data=4,model=2", (8, 3)) == P("data", None)
    assert wb.layout.validate_spec("(data, model)", "data=4,model=2", (8, 16)) == P("data", "model")
    assert wb.layout.validate_spec("(data, model),", "data=4,model=2", (16, 3)) == P(("data", "model"))
    # Fewer entries than dimensions: the rest are unsharded.
    assert wb.layout.validate_spec("data", "data=4", (8, 5, 7)) == P("data")
