"""Whole-pytree layouts of real NNX models and optimizer state, from abstract state only."""

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import workbench as wb


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(64, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


@pytest.fixture(scope="module")
def abstract_state():
    optimizer = nnx.eval_shape(lambda: nnx.Optimizer(MLP(nnx.Rngs(0)), optax.adam(1e-3), wrt=nnx.Param))
    model = nnx.eval_shape(lambda: MLP(nnx.Rngs(0)))
    state = {"params": nnx.state(model, nnx.Param), "opt": nnx.state(optimizer)}
    # Abstract state: nothing was allocated.
    leaves = jax.tree.leaves(state)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    return state


def test_shard_strategy_reports_replicated_leaves(abstract_state):
    table = wb.layout_tree(abstract_state, "data=8", "shard")
    rows = {r["path"]: r for r in table.rows()}
    assert rows["params/hidden/kernel"]["spec"] == "None, data"  # 128 > 64: the larger dim
    assert rows["params/out/kernel"]["spec"] == "data, None"
    assert rows["params/out/bias"]["replication"] == 8
    assert "no dimension of (10,) is divisible" in rows["params/out/bias"]["reason"]
    assert rows["opt/step"]["reason"] == "replicated: scalar"
    assert rows["opt/opt_state/0/count"]["reason"] == "replicated: scalar"
    # Adam's moments mirror the params and are sharded the same way.
    assert rows["opt/opt_state/0/mu/hidden/kernel"]["spec"] == "None, data"
    params = (64 * 128 + 128 + 128 * 10 + 10) * 4
    assert table.total_bytes == params * 3 + 4 + 4
    sharded = (64 * 128 + 128 + 128 * 10) * 4 // 8 + 10 * 4
    assert table.group_bytes_per_device()["params"] == sharded
    assert set(table.per_device_bytes) == set(range(8))
    assert table.bytes_per_device == sharded * 3 + 8


def test_rule_table_first_match_and_unused_rules(abstract_state):
    rules = wb.layout.RuleTable([(r"kernel$", "None, model"), (r"hidden/bias", "model"), (r"embed", "data"),
                                 (r".*", "")])
    table = wb.layout_tree(abstract_state["params"], "data=4,model=2", rules)
    by_path = {leaf.path: leaf for leaf in table.leaves}
    assert by_path["hidden/kernel"].rule == 0 and by_path["hidden/kernel"].layout.spec == P(None, "model")
    assert by_path["hidden/bias"].rule == 1
    assert by_path["out/bias"].rule == 3 and by_path["out/bias"].layout.is_fully_replicated
    assert table.unused_rules == (2,)
    assert table.to_json()["unused_rules"] == ["embed => data"]


def test_a_sharded_rule_table_shards_over_data_where_the_rules_leave_a_dimension_unsplit(abstract_state):
    rules = wb.layout.ShardedRuleTable([(r"hidden/kernel", "None, model"), (r"hidden/bias", "model")])
    table = wb.layout_tree(abstract_state["params"], "data=4,model=2", rules)
    kernel, bias = table.leaf("hidden/kernel"), table.leaf("hidden/bias")
    assert kernel.layout.spec == P("data", "model") and kernel.layout.shard_shape == (16, 64)  # 1/8 per device
    assert kernel.rule == 0 and kernel.reason == "rule 0: hidden/kernel; dimension 0 (64) sharded over 'data'"
    assert bias.layout.spec == P("model") and "no dimension of (128,) left unsplit" in bias.reason
    assert table.leaf("out/kernel").layout.spec == P("data", None)  # no rule: sharded as the "shard" strategy does
    # A model axis of size 1 splits nothing: the layout is the "shard" strategy's, leaf by leaf.
    assert wb.layout_tree(abstract_state, "data=8,model=1", rules).specs == wb.layout_tree(
        abstract_state, "data=8,model=1", "shard").specs


def test_rule_table_text_and_code_round_trip():
    table = wb.layout.RuleTable.parse("# comment\nkernel$ => None, model\n\n.* => P()\n")
    assert [r.pattern for r in table.rules] == ["kernel$", ".*"]
    assert wb.layout.RuleTable.parse(table.to_text()).rules == table.rules
    assert "(r'kernel$', P(None, 'model'))," in table.to_code()


def test_other_spec_sources(abstract_state):
    params = abstract_state["params"]
    by_dict = wb.layout_tree(params, "data=8", {"hidden/kernel": "None, data"})
    assert by_dict.leaf("hidden/kernel").layout.spec == P(None, "data")
    assert by_dict.leaf("out/kernel").reason == "replicated: path not in the spec dict"
    by_function = wb.layout_tree(params, "data=8", lambda path, leaf: "data" if leaf.shape[0] % 8 == 0 else "")
    assert by_function.leaf("out/bias").layout.is_fully_replicated
    assert by_function.leaf("hidden/bias").layout.spec == P("data")
    spec_tree = jax.tree.map(lambda leaf: P(), params)
    replicated = wb.layout_tree(params, "data=8", spec_tree).leaves
    assert len(replicated) == len(jax.tree.leaves(params)) > 0
    assert all(leaf.layout.is_fully_replicated for leaf in replicated)


def test_mismatched_rule_names_leaf_and_rule(abstract_state):
    with pytest.raises(wb.SpecError, match=r"leaf 'out/bias' \(shape \(10,\), rule 0 \('bias'\)\).*not divisible"):
        wb.layout_tree(abstract_state["params"], "data=4,model=4", [("bias", "model")])


def test_placed_arrays_use_their_own_sharding():
    mesh = wb.build_mesh("data=8")
    x = jax.device_put(jnp.zeros((16, 4)), jax.sharding.NamedSharding(mesh, P("data")))
    table = wb.layout_tree({"x": x, "label": "not an array"}, mesh)
    assert [leaf.path for leaf in table.leaves] == ["x"]
    assert table.leaf("x").layout.shard_shape == (2, 4)


def test_spec_tree_matches_by_position_even_for_tied_weights():
    shared = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    state = [shared, shared]  # the same object at two paths (tied weights)
    table = wb.layout_tree(state, "data=8", [P("data"), P(None, "data")])
    assert table.leaf("0").layout.spec == P("data")
    assert table.leaf("1").layout.spec == P(None, "data")
    with pytest.raises(wb.WorkbenchError, match="spec tree has 1 leaves but the state has 2"):
        wb.layout_tree(state, "data=8", [P("data")])


def test_rule_table_code_round_trips_regexes_with_backslashes():
    table = wb.layout.RuleTable(wb.training.tensor_parallel_rules("transformer") + [("it's$", "None")])
    namespace: dict = {}
    exec(table.to_code(), namespace)  # our own generated code, as a production script would paste it
    assert [pattern for pattern, _ in namespace["SHARDING_RULES"]] == [rule.pattern for rule in table.rules]
    assert r"(^|/)blocks/\d+/attn/(q|k|v)/kernel$" in table.to_code()


def test_a_tree_on_16384_devices_holds_no_per_device_lists(abstract_state):
    """Shard shapes and bytes are per leaf; per-device slices are built only for the leaf and device a view asks."""
    table = wb.layout_tree(abstract_state, wb.layout.abstract_mesh("data=2048,model=8"),
                           [(r".*hidden/kernel", P(None, "model"))])
    layouts = [leaf.layout for leaf in table.leaves]
    assert all(layout.device_ids is layouts[0].device_ids for layout in layouts)  # one id list for the mesh
    assert layouts[0].device_ids == tuple(range(16384))
    kernel = table.leaf("params/hidden/kernel").layout
    last = kernel.device_slice(16383)  # data=2047, model=7: the last 16 of 128 columns
    assert last.coords == {"data": 2047, "model": 7} and last.index == ((0, 64), (112, 128))
    assert kernel.slice_of_device(16383) == last
    assert not any({"devices", "_starts"} & vars(layout).keys() for layout in layouts)
    assert table.per_device_bytes == dict.fromkeys(range(16384), table.bytes_per_device)
    held = {index for index in (kernel.device_slice(p).index for p in range(0, 16384, 997))}
    assert held <= set(kernel.holders()) and len(kernel.holders()) == 8
    assert {"devices", "_starts"} <= vars(kernel).keys()  # built for the leaf a view asked about
