"""Runs on disk: what is written reads back, a crash loses at most the line being written, the files stay
strict JSON (non-finite floats as strings), an old run is never overwritten, and runs compare side by side."""

import json
import math
import re

import numpy as np
import pytest

from workbench.errors import RunError, WorkbenchError
from workbench.training.run_reports import choose_columns, compare_runs, compare_table
from workbench.training.runs import (
    Run,
    RunWriter,
    list_runs,
    load_run,
)

CONFIG = {"model": "mlp", "data": "digits", "mode": "dp", "mesh": "data=8", "lr": 0.001, "batch": 64, "steps": 3}


def write_run(root, name=None, config=CONFIG, records=(), status="finished", **summary):
    """A run with ``records``; status None leaves what a crash leaves on disk: no summary.json."""
    writer = RunWriter(root, name=name, config=config)
    for record in records:
        writer.append(record)
    writer.finish(status or "finished", **summary)  # always closes the metrics file
    if status is None:
        (writer.path / "summary.json").unlink()
    return writer


def reject_constant(name):
    raise AssertionError(f"non-standard JSON constant {name} in a run file")


def strict_json(text):
    return json.loads(text, parse_constant=reject_constant)


# --- writing and reading back ------------------------------------------------------------------


def test_round_trip(tmp_path):
    records = [{"step": 0, "loss": 2.5}, {"step": 1, "loss": 1.5, "accuracy": 0.5}, {"step": 2, "loss": 0.5}]
    writer = write_run(tmp_path, "baseline", records=records, final_loss=0.5)
    assert writer.name == "baseline" and writer.path == tmp_path / "baseline" and writer.finished

    run = load_run("baseline", run_root=tmp_path)
    assert isinstance(run, Run)
    assert run.name == "baseline" and run.path == tmp_path / "baseline"
    assert run.metrics == records
    assert run.config == {**CONFIG, "name": "baseline", "created": run.config["created"]}
    assert run.config["created"].endswith("+00:00")  # ISO-8601, UTC
    assert run.status == "finished"
    assert run.summary["final_loss"] == 0.5 and run.summary["ended"] >= run.config["created"]
    # The same run by folder path, and the files are what the module docstring says.
    assert load_run(tmp_path / "baseline").metrics == records
    assert sorted(p.name for p in run.path.iterdir()) == ["config.json", "metrics.jsonl", "summary.json"]
    assert len((run.path / "metrics.jsonl").read_text().splitlines()) == 3


def test_each_line_is_on_disk_before_finish(tmp_path):
    """A kernel that dies mid-run keeps every appended line: the run reads back as incomplete."""
    writer = RunWriter(tmp_path, "live")
    writer.append({"step": 0, "loss": 1.0})
    writer.append({"step": 1, "loss": 0.5})
    run = load_run(writer.path)
    assert run.status == "incomplete" and run.summary is None
    assert [r["step"] for r in run.metrics] == [0, 1]
    writer.finish("stopped")
    assert load_run(writer.path).status == "stopped"


def test_config_is_not_changed_and_numpy_scalars_are_written(tmp_path):
    config = {"model": "mlp", "lr": np.float32(0.5), "batch": np.int64(64), "shape": (8, np.int32(2))}
    writer = RunWriter(tmp_path, "np", config)
    writer.append({"step": np.int64(1), "loss": np.float32(0.25), "grad": np.array([3.0]), "ok": np.bool_(True)})
    writer.finish("finished")
    assert "name" not in config  # the caller's dict is not modified
    run = load_run(writer.path)
    assert run.config["lr"] == 0.5 and run.config["batch"] == 64 and run.config["shape"] == [8, 2]
    assert run.metrics == [{"step": 1, "loss": 0.25, "grad": 3.0, "ok": True}]
    assert type(run.metrics[0]["step"]) is int


# --- names -------------------------------------------------------------------------------------


def test_auto_name_from_config(tmp_path):
    with RunWriter(tmp_path, config={"model": "mlp", "mode": "data parallel/2"}) as writer:
        assert re.fullmatch(r"mlp-data-parallel-2-\d{8}-\d{6}", writer.name), writer.name
    with RunWriter(tmp_path) as writer:  # no model, no mode: "run", and no doubled dash
        assert re.fullmatch(r"run-\d{8}-\d{6}", writer.name), writer.name


def test_taken_name_gets_a_suffix_and_the_old_run_is_kept(tmp_path):
    first = write_run(tmp_path, "exp", records=[{"step": 0, "loss": 1.0}])
    second = write_run(tmp_path, "exp", config={"model": "cnn"})
    third = write_run(tmp_path, "exp")
    assert (first.name, second.name, third.name) == ("exp", "exp-2", "exp-3")
    assert load_run("exp", tmp_path).config["model"] == "mlp" and len(load_run("exp", tmp_path).metrics) == 1
    assert load_run("exp-2", tmp_path).config["model"] == "cnn"


def test_auto_names_in_the_same_second_do_not_collide(tmp_path):
    names = {write_run(tmp_path, config={"model": "mlp"}).name for _ in range(3)}
    assert len(names) == 3


@pytest.mark.parametrize("name", ["", "  ", "a/b", "../escape", "..", ".", "a\\b", 7])
def test_bad_names_are_errors(tmp_path, name):
    with pytest.raises(RunError, match="run name") as error:
        RunWriter(tmp_path, name=name)
    assert repr(name) in str(error.value)
    assert isinstance(error.value, WorkbenchError)
    assert not any(tmp_path.iterdir())  # nothing was written


def test_run_root_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunError, match="is a file"):
        RunWriter(tmp_path / "file", "r")


def test_run_root_parents_are_created(tmp_path):
    with RunWriter(tmp_path / "deep" / "runs", "r"):
        assert (tmp_path / "deep" / "runs" / "r" / "config.json").is_file()


# --- non-finite floats and non-JSON values -----------------------------------------------------


def test_non_finite_round_trip_and_strict_json_files(tmp_path):
    config = {"model": "mlp", "clip": math.inf, "nested": {"values": [1.0, -math.inf, math.nan]}}
    writer = RunWriter(tmp_path, "diverged", config)
    writer.append({"step": 0, "loss": math.nan, "grad_norm": math.inf, "eval": {"loss": -math.inf}})
    writer.append({"step": 1, "loss": np.float32("nan"), "nan": "label"})  # a key "nan" stays a key
    writer.finish("failed", final_loss=math.nan, history=[math.inf, 1.0])

    for path in writer.path.iterdir():  # no NaN / Infinity token anywhere
        for line in path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]:
            strict_json(line)
    assert '"nan"' in (writer.path / "metrics.jsonl").read_text()

    run = load_run(writer.path)
    first, second = run.metrics
    assert math.isnan(first["loss"]) and first["grad_norm"] == math.inf and first["eval"]["loss"] == -math.inf
    assert math.isnan(second["loss"]) and second["nan"] == "label"
    assert run.config["clip"] == math.inf
    values = run.config["nested"]["values"]
    assert values[0] == 1.0 and values[1] == -math.inf and math.isnan(values[2])
    assert math.isnan(run.summary["final_loss"]) and run.summary["history"] == [math.inf, 1.0]


@pytest.mark.parametrize(
    "record, key",
    [
        ({"step": 0, "weights": np.zeros(3)}, "weights"),
        ({"step": 0, "where": {"path": object()}}, "where.path"),
        ({"step": 0, "items": [1, {2, 3}]}, "items[1]"),
    ],
)
def test_non_json_values_are_errors_naming_the_key(tmp_path, record, key):
    with RunWriter(tmp_path, "r") as writer:
        with pytest.raises(RunError, match=re.escape(repr(key))):
            writer.append(record)
        assert (writer.path / "metrics.jsonl").read_text() == ""  # a bad record writes nothing
        writer.append({"step": 0})  # and the run goes on


def test_non_string_key_and_bad_config_write_nothing(tmp_path):
    with pytest.raises(RunError, match="key 3 of type int"):
        RunWriter(tmp_path, "r", {"layers": {3: "wide"}})
    with pytest.raises(RunError, match="'data_dir'"):
        RunWriter(tmp_path, "r", {"data_dir": tmp_path})
    assert not tmp_path.joinpath("r").exists()
    with RunWriter(tmp_path, "r") as writer, pytest.raises(RunError, match="must be a dict"):
        writer.append([1, 2])


# --- finishing ---------------------------------------------------------------------------------


def test_finish_twice_and_append_after_finish_are_errors(tmp_path):
    writer = write_run(tmp_path, "done", final_loss=0.1)
    with pytest.raises(RunError, match="already ended with status 'finished'"):
        writer.finish("failed")
    with pytest.raises(RunError, match="already ended"):
        writer.append({"step": 9})
    assert load_run(writer.path).summary["final_loss"] == 0.1  # the first summary stands


def test_unknown_status_is_an_error_and_the_run_stays_open(tmp_path):
    writer = RunWriter(tmp_path, "r")
    with pytest.raises(RunError, match="'done' is not one of finished, stopped, failed"):
        writer.finish("done")
    with pytest.raises(RunError, match="'bad'"):
        writer.finish("finished", bad=object())
    writer.finish("finished")
    assert load_run(writer.path).status == "finished"


def test_context_manager_marks_failure_and_reraises(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with RunWriter(tmp_path, "crash") as writer:
            writer.append({"step": 0, "loss": 1.0})
            _ = 1 / 0
    run = load_run("crash", tmp_path)
    assert run.status == "failed"
    assert run.summary["error"] == "ZeroDivisionError: division by zero"
    assert run.metrics == [{"step": 0, "loss": 1.0}]


def test_context_manager_interrupt_is_stopped_and_clean_exit_is_finished(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with RunWriter(tmp_path, "interrupted"):
            raise KeyboardInterrupt
    with RunWriter(tmp_path, "clean"):
        pass
    with RunWriter(tmp_path, "explicit") as writer:
        writer.finish("stopped", reason="early stop")
    statuses = {run.name: run.status for run in list_runs(tmp_path)}
    assert statuses == {"interrupted": "stopped", "clean": "finished", "explicit": "stopped"}


# --- crashes and garbled files -----------------------------------------------------------------


@pytest.mark.parametrize("tail", [b'{"step": 2, "lo', b'{"step": 2, "name": "\xc3', b"\x00\x00\x00", b"[1, 2]\n"])
def test_truncated_last_line_is_skipped(tmp_path, tail):
    writer = write_run(tmp_path, "crashed", records=[{"step": 0}, {"step": 1}], status=None)
    with open(writer.path / "metrics.jsonl", "ab") as file:
        file.write(tail)
    run = load_run(writer.path)
    assert run.metrics == [{"step": 0}, {"step": 1}] and run.status == "incomplete"


def test_garbled_middle_line_names_the_file_and_line(tmp_path):
    writer = write_run(tmp_path, "edited", records=[{"step": 0}, {"step": 1}, {"step": 2}])
    path = writer.path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = '{"step": 1, oops'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunError, match=r"metrics\.jsonl' line 2 is not a JSON object"):
        load_run(writer.path)
    with pytest.raises(RunError, match="line 2"):
        list_runs(tmp_path)


def test_blank_lines_are_ignored(tmp_path):
    writer = write_run(tmp_path, "r", records=[{"step": 0}, {"step": 1}])
    path = writer.path / "metrics.jsonl"
    path.write_text(path.read_text().replace("\n", "\n\n"))
    assert len(load_run(writer.path).metrics) == 2


def test_garbled_config_is_an_error(tmp_path):
    writer = write_run(tmp_path, "r")
    (writer.path / "config.json").write_text("{not json")
    with pytest.raises(RunError, match=r"config\.json' is not valid JSON"):
        load_run(writer.path)


# --- finding runs ------------------------------------------------------------------------------


def test_missing_run_lists_the_available_ones(tmp_path):
    for name in ("alpha", "beta"):
        write_run(tmp_path, name)
    with pytest.raises(RunError, match="no run 'gamma'") as error:
        load_run("gamma", run_root=tmp_path)
    assert "alpha, beta" not in str(error.value)  # newest first
    assert "beta, alpha" in str(error.value) and str(tmp_path / "gamma") in str(error.value)


def test_missing_run_lists_at_most_ten(tmp_path):
    for index in range(12):
        write_run(tmp_path, f"r{index:02d}")
    with pytest.raises(RunError, match="the 10 newest of 12") as error:
        load_run("nope", tmp_path)
    assert "r11" in str(error.value) and "r01," not in str(error.value)


def test_missing_run_with_no_runs_says_how_runs_are_made(tmp_path):
    with pytest.raises(RunError, match="no runs in .* yet.*RunWriter"):
        load_run("anything", run_root=tmp_path / "missing")


def test_folder_without_config_is_not_a_run(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(RunError, match="not a run folder: it has no config.json"):
        load_run("notes", tmp_path)


def test_list_runs_oldest_first_and_skips_other_folders(tmp_path):
    assert list_runs(tmp_path / "missing") == []
    for name in ("zeta", "alpha", "mid"):
        write_run(tmp_path, name)
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    assert [run.name for run in list_runs(tmp_path)] == ["zeta", "alpha", "mid"]  # creation order, not names
    # Equal creation times fall back to the name.
    for name in ("zeta", "alpha", "mid"):
        path = tmp_path / name / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "created": "2025-01-01T00:00:00.000000+00:00"}))
    assert [run.name for run in list_runs(tmp_path)] == ["alpha", "mid", "zeta"]


# --- metrics of one run ------------------------------------------------------------------------


def test_series_and_final(tmp_path):
    records = [
        {"step": 0, "loss": 3.0, "lr": 0.1},
        {"step": 1, "loss": 2.0},
        {"epoch": 1, "eval_loss": 2.5},  # no step: not in any series, but in final
        {"step": 2, "loss": 1.0, "eval_loss": 1.5, "note": "text"},
    ]
    run = load_run(write_run(tmp_path, "r", records=records).path)
    assert run.series("loss") == ([0, 1, 2], [1.0 * 3, 2.0, 1.0])
    assert run.series("eval_loss") == ([2], [1.5])
    assert run.final == {"step": 2, "loss": 1.0, "lr": 0.1, "epoch": 1, "eval_loss": 1.5, "note": "text"}
    with pytest.raises(RunError, match="no numeric 'acc'.*choose one of eval_loss, loss, lr"):
        run.series("acc")


def test_empty_run_series_and_final(tmp_path):
    run = load_run(write_run(tmp_path, "empty").path)
    assert run.metrics == [] and run.final == {}
    with pytest.raises(RunError, match="no stepped metrics yet"):
        run.series("loss")


# --- comparing runs ----------------------------------------------------------------------------


@pytest.fixture
def three_runs(tmp_path):
    write_run(tmp_path, "mlp-dp", records=[{"step": 0, "loss": 2.0}, {"step": 99, "loss": 0.123456, "acc": 0.9}])
    write_run(tmp_path, "cnn-fsdp", {"model": "cnn", "mode": "fsdp", "lr": 0.01}, [{"step": 5, "loss": math.nan}])
    write_run(tmp_path, "crashed", {"model": "transformer"}, [{"step": 1, "loss": 4.0, "lr": 0.5}], status=None)
    return tmp_path


def test_compare_runs_rows(three_runs):
    rows = compare_runs(["mlp-dp", "cnn-fsdp", load_run("crashed", three_runs)], run_root=three_runs)
    assert [list(row) for row in rows] == [
        ["name", "status", "model", "data", "mode", "mesh", "lr", "batch", "steps", "last_step", "loss", "acc",
         "final_lr"]
    ] * 3  # every row has the same columns; the logged lr does not hide the config's lr
    mlp, cnn, crashed = rows
    assert mlp["status"] == "finished" and mlp["last_step"] == 99 and mlp["acc"] == 0.9 and mlp["lr"] == 0.001
    assert cnn["data"] is None and cnn["acc"] is None and math.isnan(cnn["loss"])
    assert crashed["status"] == "incomplete" and crashed["final_lr"] == 0.5 and crashed["lr"] is None
    assert compare_runs([], run_root=three_runs) == []


def test_compare_runs_with_keys(three_runs):
    rows = compare_runs(["mlp-dp", "crashed"], keys=["acc", "last_step"], run_root=three_runs)
    assert [(r["name"], r["acc"], r["last_step"]) for r in rows] == [("mlp-dp", 0.9, 99), ("crashed", None, 1)]
    assert "loss" not in rows[0]
    with pytest.raises(RunError, match="'accuracy' is in none of these runs: choose from acc, last_step, loss"):
        compare_runs(["mlp-dp"], keys=["accuracy"], run_root=three_runs)
    with pytest.raises(RunError, match="no run 'missing'.*mlp-dp"):
        compare_runs(["missing"], run_root=three_runs)


def test_compare_table(three_runs):
    table = compare_table(list_runs(three_runs))
    header, rule, *lines = table.splitlines()
    assert len(lines) == 3
    for name in ("mlp-dp", "cnn-fsdp", "crashed"):
        assert sum(line.startswith(name + " ") for line in lines) == 1
    # The rule's dash runs mark the columns: every header word and cell lies inside its column.
    spans = [m.span() for m in re.finditer(r"-+", rule)]
    assert len(spans) == len(header.split()) == 13
    for line in [header, *lines]:
        for start, end in spans:
            assert line[start - 1 : start].strip() == "" and line[end : end + 1].strip() == ""
            assert line[start:end].strip() != ""
    mlp = next(line for line in lines if line.startswith("mlp-dp"))
    assert "0.1235" in mlp and "0.123456" not in mlp  # 4 significant digits
    cnn = next(line for line in lines if line.startswith("cnn-fsdp"))
    assert " nan" in cnn and " - " in cnn  # NaN shown, missing values as '-'
    # Numbers are right-aligned: the last_step column ends at its rule's end.
    last_step = header.split().index("last_step")
    start, end = spans[last_step]
    assert mlp[start:end].endswith("99")


def test_compare_table_of_no_runs(tmp_path):
    assert compare_table([], run_root=tmp_path).splitlines() == ["name  status", "----  ------"]


# --- the `workbench runs` table: the useful columns by default, the rest on request ---------------------------

# What a trainer logs (see workbench.training.trainer): loss and speed per interval, gradient-sync diagnostics,
# evaluation. With the config fields that is 24 columns, about 320 characters a line.
LOGGED = [
    {"step": 100, "loss": 0.31, "grad_norm": 0.8139, "examples_per_s": 52490.0, "step_time_s": 0.004877},
    {"step": 100, "sync_replicas": 8, "sync_synced_grad_norm": 0.7859, "sync_replica_divergence": 0.0,
     "sync_per_replica_batch": 31.4, "sync_global_batch": 256, "sync_noise_scale": 113.2, "sync_suggested_batch": 113},
    {"step": 100, "eval_accuracy": 0.8806, "eval_loss": 0.9966},
]


@pytest.fixture
def realistic_runs(tmp_path):
    for model, mode, mesh in [("transformer", "dp-shard-map", "data=4,model=2"), ("mlp", "dp", "data=8"),
                              ("cnn", "fsdp", "data=8"), ("transformer", "dp-tp", "data=2,model=4")]:
        config = {**CONFIG, "model": model, "mode": mode, "mesh": mesh, "optimizer": "adamw", "steps": 100}
        write_run(tmp_path, f"{model}-{mode}-20261122-183117", config, LOGGED)  # the trainer's default names
    write_run(tmp_path, "crashed-run", CONFIG, LOGGED[:1], status=None)
    return tmp_path


def run_cli(capsys, *argv):
    from workbench.cli.main import main

    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_runs_default_table_fits_120_characters_and_says_what_is_left_out(capsys, realistic_runs):
    status, out, err = run_cli(capsys, "runs", "--run-dir", str(realistic_runs))
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert max(map(len, lines)) <= 120
    header = lines[0].split()
    assert header == ["name", "status", "mode", "mesh", "model", "loss", "eval_accuracy"]  # all that fits
    short = realistic_runs / "short"
    for number in range(3):
        write_run(short, f"run-{number}", CONFIG, LOGGED)
    status, out, _ = run_cli(capsys, "runs", "--run-dir", str(short))
    assert max(map(len, out.splitlines())) <= 120  # shorter names leave room for more
    assert out.splitlines()[0].split() == [
        "name", "status", "mode", "mesh", "model", "loss", "eval_accuracy", "eval_loss", "examples_per_s",
        "last_step", "data"
    ]
    assert len(lines) == 2 + 5 + 1  # header, rule, five runs, the note
    assert lines[-1].startswith(f"({24 - len(header)} more columns: --all-columns shows every one")
    assert lines[2].split()[:5] == ["transformer-dp-shard-map-20261122-183117", "finished", "dp-shard-map",
                                    "data=4,model=2", "transformer"]
    assert max(map(len, compare_table(list_runs(realistic_runs)).splitlines())) > 300  # what it was before


def test_runs_all_columns_shows_every_column(capsys, realistic_runs):
    status, out, _ = run_cli(capsys, "runs", "--run-dir", str(realistic_runs), "--all-columns")
    assert status == 0
    header, rule, *rows = out.splitlines()
    assert header.split() == list(compare_runs(list_runs(realistic_runs))[0]) and len(header.split()) == 24
    assert len(rows) == 5 and "more columns" not in out


def test_runs_columns_picks_them_in_order_for_the_table_and_json(capsys, realistic_runs):
    status, out, _ = run_cli(capsys, "runs", "--run-dir", str(realistic_runs),
                             "--columns", "name, sync_noise_scale,loss")
    assert status == 0
    header, rule, *rows = out.splitlines()
    assert header.split() == ["name", "sync_noise_scale", "loss"] and len(rows) == 5
    assert rows[-1].split() == ["crashed-run", "-", "0.31"]
    status, out, _ = run_cli(capsys, "runs", "--run-dir", str(realistic_runs), "--columns", "name,loss", "--json")
    assert json.loads(out)["runs"][0] == {"name": "transformer-dp-shard-map-20261122-183117", "loss": 0.31}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--columns", "name,acuracy"], "unknown column 'acuracy': these runs have name, status, model"),
        (["--columns", " , "], "--columns ' , ' names no column"),
        (["--columns", "name", "--all-columns"], "not allowed with argument --columns"),
    ],
)
def test_runs_bad_columns_are_one_line_and_exit_2(capsys, realistic_runs, argv, message):
    status, out, err = run_cli(capsys, "runs", "--run-dir", str(realistic_runs), *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_choose_columns():
    rows = compare_runs([Run("a-run", None, {"model": "mlp"}, [{"step": 3, "loss": 0.5}], None)])
    assert choose_columns(rows, ["loss", "name"]) == ["loss", "name"]
    assert choose_columns(rows, ["name", "bogus", "loss"], skip_missing=True) == ["name", "loss"]
    with pytest.raises(RunError, match="unknown column 'bogus': these runs have name, status, model, last_step, loss"):
        choose_columns(rows, ["name", "bogus"])
    # Widths name 5, model 5, status 10 ("incomplete"), loss 4, two spaces apart: status does not fit in 18
    # after name and model, loss still does.
    assert choose_columns(rows, ["name", "model", "status", "loss"], max_width=18) == ["name", "model", "loss"]
    assert choose_columns(rows, ["name", "status"], max_width=1) == ["name"]  # the name always stays
