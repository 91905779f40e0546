"""The layout linter and planning your own NNX model on an abstract production mesh."""

import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec

from workbench.cli.main import main
from workbench.errors import SpecError, WorkbenchError
from workbench.layout.lint import lint_layout, lint_text
from workbench.analysis.planning import plan_training
from workbench.layout.specs import parse_spec
from workbench.layout.tree_layout import layout_tree

MiB = 1 << 20


def leaf(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_every_indivisible_leaf_is_reported_not_just_the_first():
    state = {"a": leaf(1000, 64), "b": leaf(64, 999), "c": leaf(64, 64)}
    rules = [("a", "data, None"), ("b", "None, data"), ("c", "data, None")]
    with pytest.raises(SpecError, match="leaf 'a'"):
        layout_tree(state, "data=16", rules)  # the default stops at the first
    layout = layout_tree(state, "data=16", rules, on_invalid="replicate")
    assert layout.leaf("c").layout.spec == PartitionSpec("data", None)  # the valid leaf as asked
    assert layout.leaf("a").layout.is_fully_replicated and "1000" in layout.leaf("a").problem
    errors = [w for w in lint_layout(layout) if w.kind == "indivisible"]
    assert [w.path for w in errors] == ["a", "b"] and all(w.severity == "error" for w in errors)
    assert "999" in errors[1].fix and "pad it to 1008" in errors[1].fix


def test_large_replicated_leaf_gets_a_spec_that_really_saves_the_bytes():
    state = {"embed": leaf(32000, 2048), "bias": leaf(2048)}
    layout = layout_tree(state, "data=64,model=8", "replicate")
    [warning] = lint_layout(layout)  # the small bias stays quiet
    assert warning.kind == "large-replicated" and warning.path == "embed"
    assert warning.bytes_per_device == 32000 * 2048 * 4 and "512 devices" in warning.message
    spec_text = warning.fix[warning.fix.index("P("):warning.fix.index(")") + 1]
    fixed = layout_tree({"embed": state["embed"]}, "data=64,model=8", parse_spec(spec_text))
    assert fixed.bytes_per_device == warning.bytes_per_device // 64  # the best single axis: data
    assert f"{fixed.bytes_per_device / MiB:.1f} MiB per device" in warning.fix


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 5000), st.sampled_from([2, 4, 8, 16, 64]))
def test_padding_advice_makes_the_leaf_shardable(rows, cols, size):
    state = {"w": leaf(rows, cols)}
    layout = layout_tree(state, f"data={size}", "replicate")
    warnings = lint_layout(layout, min_bytes=0)
    [warning] = warnings
    if "pad dimension" in warning.fix:
        dim = int(warning.fix.split("pad dimension ")[1].split(" ")[0])
        padded = int(warning.fix.split(" to ")[1].split(" ")[0])
        assert padded % size == 0 and 0 <= padded - (rows, cols)[dim] < size
        shape = [rows, cols]
        shape[dim] = padded
        assert not layout_tree({"w": leaf(*shape)}, f"data={size}", "shard").replicated_leaves
    else:
        assert rows % size == 0 or cols % size == 0


def test_one_device_and_unused_rules():
    state = {"dense": {"kernel": leaf(4096, 4096)}}
    assert lint_layout(layout_tree(state, "data=1", "replicate")) == []  # nothing to share
    layout = layout_tree(state, "data=8", [("dense/kernal", "data, None"), ("dense/kernel", "None, data")])
    [warning] = lint_layout(layout)
    assert warning.kind == "unused-rule" and "kernal" in warning.message and "dense/kernel" in warning.fix
    assert "unused-rule" not in lint_text([]) and "no layout warnings" == lint_text([])


def test_lint_text_caps_long_lists():
    state = {f"w{i}": leaf(1024, 1024) for i in range(12)}
    text = lint_text(lint_layout(layout_tree(state, "data=8", "replicate")), limit=5)
    assert text.count("\n  - ") == 5 and "and 7 more (28.0 MiB per device" in text


# --- planning your own model -------------------------------------------------------------------------


class Block(nnx.Module):
    def __init__(self, d: int, rngs: nnx.Rngs):
        self.up = nnx.Linear(d, 4 * d, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, rngs=rngs)


class TinyLM(nnx.Module):
    def __init__(self, vocab: int, d: int, layers: int, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.blocks = nnx.List([Block(d, rngs) for _ in range(layers)])
        self.head = nnx.Linear(d, vocab, rngs=rngs)


OWN_RULES = [("embed/embedding", "None, model"), ("up/kernel", "data, model"), ("down/kernel", "model, data"),
             ("head/kernel", "data, model")]


def test_your_own_model_as_instance_builder_or_abstract_gives_one_plan():
    build = lambda: TinyLM(1000, 64, 2, nnx.Rngs(0))  # noqa: E731
    plans = [plan_training(m, None, "data=8", "fsdp", hardware="cpu") for m in (build, build(), nnx.eval_shape(build))]
    assert {p.model for p in plans} == {"TinyLM"}
    assert len({(p.params, p.total_bytes, p.predicted_step_comm_s) for p in plans}) == 1
    plan = plans[0]
    state = nnx.state(nnx.eval_shape(build), nnx.Param)
    assert plan.params == sum(x.size for x in jax.tree.leaves(state))
    assert plan.params_bytes == layout_tree(state, "data=8", "shard").bytes_per_device
    # 6 FLOPs per parameter per example (no seq_len): per token with seq_len
    assert plan.flops_per_device == pytest.approx(6 * plan.params * plan.examples_per_device)
    with_tokens = plan_training(build, None, "data=8", "fsdp", hardware="cpu", seq_len=128)
    assert with_tokens.flops_per_device == pytest.approx(128 * plan.flops_per_device)


def test_a_billion_parameter_model_of_your_own_on_512_devices_warns_and_exports():
    build = lambda: TinyLM(50257, 2048, 24, nnx.Rngs(0))  # noqa: E731  (1B parameters, never allocated)
    plan = plan_training(build, None, "data=64,model=8", "dp-tp", rules=OWN_RULES, seq_len=1024,
                         device_memory="16GiB")
    assert plan.params > 1e9 and plan.mesh.size == 512
    [error] = [w for w in plan.warnings if w.severity == "error"]
    assert error.path == "head/kernel" and "50257" in error.fix  # the vocab does not split over model=8
    text = plan.to_text()
    assert "layout warnings" in text and "error: head/kernel" in text
    assert json.loads(json.dumps(plan.to_json()))["warnings"][0]["kind"] == "indivisible"
    namespace = {}
    exec(plan.rules_code(), namespace)  # the export places what the plan placed: the bad leaf replicated
    params = nnx.state(nnx.eval_shape(build), nnx.Param)
    assert layout_tree(params, "data=64,model=8", namespace["SHARDING_RULES"]).bytes_per_device == plan.params_bytes
    assert [c.kind for c in plan.collectives] == ["all-gather", "reduce-scatter", "all-reduce"]


def test_valid_own_rules_are_exported_as_given_with_a_catch_all():
    build = lambda: TinyLM(1024, 64, 2, nnx.Rngs(0))  # noqa: E731
    plan = plan_training(build, None, "data=4,model=2", "dp-tp", rules=OWN_RULES, hardware="cpu")
    assert not [w for w in plan.warnings if w.severity == "error"]
    assert [r.pattern for r in plan.rule_table.rules] == [p for p, _ in OWN_RULES] + [".*"]


def test_own_model_mistakes_are_named():
    build = lambda: TinyLM(1000, 64, 1, nnx.Rngs(0))  # noqa: E731
    with pytest.raises(WorkbenchError, match="model_options .* apply to registered models only"):
        plan_training(build, {"d": 3}, "data=8", "dp")
    with pytest.raises(WorkbenchError, match="neither a registered model's name nor an nnx.Module"):
        plan_training(42, None, "data=8", "dp")
    with pytest.raises(WorkbenchError, match="returned dict, not an nnx.Module"):
        plan_training(lambda: {}, None, "data=8", "dp")
    with pytest.raises(WorkbenchError, match="pass rules="):
        plan_training(build, None, "data=4,model=2", "dp-tp")
    with pytest.raises(WorkbenchError, match="seq_len 0 must be a whole number"):
        plan_training(build, None, "data=8", "dp", seq_len=0)


def test_plan_cli_reads_a_rule_file(tmp_path, capsys):
    rules = tmp_path / "rules.txt"
    rules.write_text("# my table\nembed => None, model\nhead/kernel => None, model\n.* => P()\n")
    status = main(["plan", "--model", "transformer", "--config", "vocab=1001", "--mesh", "data=4,model=2",
                   "--mode", "dp-tp", "--rules", str(rules), "--json"])
    out, err = capsys.readouterr()
    assert status == 0 and err == ""
    [warning] = json.loads(out)["warnings"]  # the vocab (1001) does not split over model=2
    assert warning["kind"] == "indivisible" and warning["path"] == "head/kernel" and "1001" in warning["fix"]
    status = main(["plan", "--mesh", "data=8", "--mode", "dp", "--rules", str(tmp_path / "missing.txt")])
    out, err = capsys.readouterr()
    assert status == 2 and out == "" and err.count("\n") == 1 and "missing.txt" in err


def test_anchored_pattern_that_misses_the_optimizer_moments_is_caught():
    build = lambda: TinyLM(32000, 256, 1, nnx.Rngs(0))  # noqa: E731
    anchored = [("^embed/embedding$", "model, None"), (".*", "")]
    plan = plan_training(build, None, "data=8,model=8", "dp-tp", rules=anchored, hardware="cpu")
    kinds = {w.kind for w in plan.warnings}
    assert "state-not-split" in kinds and "unused-rule" not in kinds
    [moment] = [w for w in plan.warnings if w.kind == "state-not-split" and w.path.endswith("mu/embed/embedding")]
    assert "(^|/)embed/embedding$" in moment.fix and "P('model', None)" in moment.message
    fixed = plan_training(build, None, "data=8,model=8", "dp-tp", hardware="cpu",
                          rules=[("(^|/)embed/embedding$", "model, None"), (".*", "")])
    assert "state-not-split" not in {w.kind for w in fixed.warnings}
    assert fixed.opt_state_bytes < plan.opt_state_bytes
