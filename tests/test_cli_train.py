"""``workbench train``: the JSON contract, the issue's accuracy bar for every mode, and exit statuses."""

from __future__ import annotations

import json

import pytest

import workbench as wb
from helpers import mode_mesh
from workbench.cli.main import main
from workbench.training.modes import MODES
from workbench.training.runs import load_run

# Every registered mode, 300 steps each from the command line: dp in `make test`, the others in the e2e tier (each is
# exact against single in tests/test_modes.py; this is the long run end to end).
MODE_MESHES = [(mode, mode_mesh(mode)) if mode == "dp" else pytest.param(mode, mode_mesh(mode), marks=pytest.mark.e2e)
               for mode in MODES]


def train(capsys, tmp_path, *argv):
    status = main(["train", "--run-dir", str(tmp_path), *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("mode,mesh", MODE_MESHES)
def test_every_mode_reaches_90_percent_on_held_out_digits(capsys, tmp_path, mode, mesh):
    status, out, err = train(
        capsys, tmp_path, "--model", "mlp", "--data", "digits", "--mesh", mesh, "--mode", mode, "--steps", "300",
        "--json"
    )
    assert status == 0, err
    result = json.loads(out)  # exactly one JSON object
    assert {"model", "data", "mode", "mesh", "steps", "final_loss", "eval", "examples_per_s", "run_dir"} <= set(result)
    assert (result["model"], result["data"], result["mode"], result["steps"]) == ("mlp", "digits", mode, 300)
    assert result["mesh"] == wb.parse_mesh(mesh).axes
    assert result["eval"]["accuracy"] >= 0.90
    assert result["final_loss"] < 0.5 and result["examples_per_s"] > 0
    assert load_run(result["run_dir"]).status == "finished"


@pytest.mark.e2e  # 150 steps trained to a bar, end to end, as the modes' long runs above (26 s with a cold cache)
def test_the_transformer_learns_text_below_its_unigram_entropy(capsys, tmp_path):
    status, out, err = train(
        capsys, tmp_path, "--model", "transformer", "--data", "text", "--mode", "dp", "--steps", "150", "--batch", "32",
        "--lr", "3e-3", "--model-options", "d_model=64", "--data-options", "seq_len=32", "--eval-every", "0", "--json",
    )
    assert status == 0, err
    result = json.loads(out)
    entropy = load_run(result["run_dir"]).config["unigram_entropy"]
    assert 3.0 < entropy < 3.3  # Python source, bytes
    assert result["eval"]["loss"] < entropy - 0.3  # it uses context, not just letter frequencies


def test_human_output_names_the_figures_and_the_run(capsys, tmp_path):
    status, out, err = train(capsys, tmp_path, "--model", "linear", "--data", "regression", "--steps", "20",
                             "--lr", "0.1", "--optimizer", "sgd", "--accum", "2", "--precision", "bf16")
    assert status == 0, err
    assert out.startswith("finished: linear on regression, mode dp, mesh data=8, 20 steps")
    assert "eval loss" in out and str(tmp_path) in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--mode", "tp"], "mode 'tp' needs a mesh axis 'model'"),
        (["--mode", "fsdp-tp"], "mode 'fsdp-tp' needs a mesh axis 'model', but mesh data=8 has data: use e.g. --mesh "
                                "data=4,model=2"),
        (["--batch", "100"], "use a batch of 96 or 104"),
        (["--mode", "tp", "--mesh", "model=2", "--model", "linear", "--data", "regression"], "no splittable layer"),
        (["--model", "mlp", "--data", "text"], "trains on classification data"),
        (["--mesh", "data=16"], "needs 16 devices but JAX has 8"),
        (["--steps", "0"], "steps=0"),
        (["--model-options", "hidden=-3"], "hidden=-3"),
        (["--data", "mnist"], "unknown data set 'mnist'"),
        (["--mode", "ddp"], "invalid choice: 'ddp'"),
        (["--remat", "blocks"], "invalid choice: 'blocks' (choose from 'none', 'block', 'dots')"),
        (["--remat", "block"], "model 'mlp' cannot apply remat 'block' (it has no repeated blocks): choose one of "
                               "none"),
        (["--lr", "abc"], "invalid float value: 'abc'"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(capsys, tmp_path, argv, message):
    status, out, err = train(capsys, tmp_path, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert not any(tmp_path.iterdir())  # nothing was written


def test_a_failed_run_exits_1_with_the_reason(capsys, tmp_path):
    status, out, err = train(capsys, tmp_path, "--model", "linear", "--data", "regression", "--optimizer", "sgd",
                             "--lr", "1e12", "--steps", "30", "--json")
    assert status == 1
    assert "failed" in err and "loss is" in err and "Lower the learning rate" in err
    result = json.loads(out)  # still exactly one JSON object, strict (no NaN)
    assert result["status"] == "failed" and "error" in result


def test_runs_lists_past_runs(capsys, tmp_path):
    train(capsys, tmp_path, "--model", "linear", "--data", "regression", "--steps", "5", "--name", "first")
    assert main(["runs", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "first" in out and "finished" in out
    assert main(["runs", "--run-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["name"] == "first"
