"""The command line: the JSON contract, readable output, and one-line errors with exit status 2."""

import json
import os
import re
import pathlib
import subprocess
import sys

import pytest

from workbench.cli.main import main

WORKBENCH = pathlib.Path(sys.executable).with_name("workbench")


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_inspect_json_contract(capsys):
    status, out, err = run_cli(
        capsys, "inspect", "--mesh", "data=2,model=4", "--shape", "8,16,32", "--spec", "data, None, model", "--json"
    )
    assert status == 0 and err == ""
    result = json.loads(out)  # exactly one JSON object
    assert {k: result[k] for k in result if k != "devices"} == {
        "shape": [8, 16, 32],
        "dtype": "float32",
        "mesh": {"data": 2, "model": 4},
        "spec": ["data", None, "model"],
        "shard_shape": [4, 16, 8],
        "bytes_per_device": 2048,
        "replication": 1,
    }
    assert result["devices"][0] == {"id": 0, "coords": {"data": 0, "model": 0}, "index": [[0, 4], [0, 16], [0, 8]]}
    assert result["devices"][5] == {"id": 5, "coords": {"data": 1, "model": 1}, "index": [[4, 8], [0, 16], [8, 16]]}
    assert [d["id"] for d in result["devices"]] == list(range(8))


def test_inspect_json_scalar_grouped_axes_and_bf16(capsys):
    status, out, _ = run_cli(capsys, "inspect", "--mesh", "data=2,model=4", "--shape", "", "--json")
    scalar = json.loads(out)
    assert status == 0 and scalar["shape"] == [] and scalar["replication"] == 8
    assert scalar["devices"][3]["index"] == []
    _, out, _ = run_cli(
        capsys, "inspect", "--mesh", "data=2,model=4", "--shape", "16,3", "--spec", "(data, model),",
        "--dtype", "bfloat16", "--json"
    )
    grouped = json.loads(out)
    assert grouped["spec"] == [["data", "model"]] and grouped["bytes_per_device"] == 2 * 3 * 2
    assert grouped["devices"][7]["index"] == [[14, 16], [0, 3]]


def test_inspect_huge_abstract_mesh(capsys):
    status, out, _ = run_cli(capsys, "inspect", "--mesh", "data=64,model=16", "--shape", "4096,1024",
                             "--spec", "data, model", "--json")
    result = json.loads(out)
    assert status == 0 and len(result["devices"]) == 1024
    assert result["devices"][-1]["index"] == [[4032, 4096], [960, 1024]]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["inspect", "--mesh", "data=3", "--shape", "8", "--spec", "data"], "not divisible by mesh axis 'data' (3)"),
        (["inspect", "--mesh", "data=0", "--shape", "8"], "size 0"),
        (["inspect", "--mesh", "data=2", "--shape", "8,x"], "'x'"),
        (["inspect", "--mesh", "data=2", "--shape", "8", "--spec", "batch"], "'batch'"),
        (["inspect", "--mesh", "data=2", "--shape", "8", "--dtype", "float33"], "'float33'"),
        (["inspect", "--mesh", "data=2", "--shape", "8", "--spec", "data,,"], "empty entry"),
        (["inspect", "--mesh", "data=4,model=2", "--shape", "16", "--spec", "(data, model)"], "write '(data, model),'"),
        (["inspect", "--shape", "8"], "--mesh"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_input_is_one_line_and_status_2(capsys, argv, fragment):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err


def test_console_script_exit_status_and_no_traceback():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    bad = subprocess.run(
        [str(WORKBENCH), "inspect", "--mesh", "data=4", "--shape", "10", "--spec", "data"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "error: dimension 0 of size 10 is not divisible by mesh axis 'data' (4): "
        "pad it to 12 or use None for dimension 0"
    ]
    good = subprocess.run([str(WORKBENCH), "devices", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert good.returncode == 0 and json.loads(good.stdout)["count"] == 8


def test_output_piped_into_a_closed_reader_exits_quietly():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    piped = subprocess.run(
        f"'{WORKBENCH}' inspect --mesh data=64,model=16 --shape 4096,1024 --spec 'data, model' --json | head -c 10",
        shell=True, capture_output=True, text=True, env=env, timeout=120,
    )
    assert piped.stdout == '{"shape": ' and "Traceback" not in piped.stderr


def test_exit_statuses_are_defined_once():
    # Every subcommand imports them from cli/exit_codes.py: a second definition could drift from it.
    from workbench.cli import exit_codes

    cli = pathlib.Path(exit_codes.__file__).parent
    for path in cli.glob("*.py"):
        if path.name != "exit_codes.py":
            assert not re.search(r"^EXIT_\w+\s*[,=]", path.read_text(), re.MULTILINE), path.name
    codes = (exit_codes.EXIT_OK, exit_codes.EXIT_FAILED, exit_codes.EXIT_BAD_INPUT, exit_codes.EXIT_INTERRUPTED)
    assert codes == (0, 1, 2, 130)


def test_the_trainer_states_end_as_runs_do():
    from workbench.training import runs, trainer

    assert runs.END_STATUSES == ("finished", "stopped", "failed")
    assert trainer.STATUSES == ("idle", "running", "paused", *runs.END_STATUSES)
