"""JAX's persistent compilation cache: on by default in a per-user folder, overridable, and a second
process really reads the first one's compiled programs (counted with JAX's own monitoring events)."""

import json
import os
import stat
import subprocess
import sys

import pytest

from workbench.cli.main import main

# A child that trains one step of the digits mlp in dp on 8 devices and reports what the cache did.
_CHILD = """
import json
import jax
from jax import monitoring

counts = {"hits": 0, "misses": 0}
monitoring.register_event_listener(
    lambda event, **_: counts.__setitem__("hits", counts["hits"] + 1) if event == "/jax/compilation_cache/cache_hits"
    else counts.__setitem__("misses", counts["misses"] + 1) if event == "/jax/compilation_cache/cache_misses" else None
)
import workbench as wb

config = wb.TrainConfig(steps=1, batch=64, log_every=1, eval_every=0, sync_every=0)
trainer = wb.Trainer(config, run_root=__import__("sys").argv[1])
summary = trainer.run()
print(json.dumps({**counts, "loss": summary["final_loss"], "info": wb.compile_cache.compilation_cache_info()}))
"""


def _environment(**env) -> dict:
    """This process's environment without any cache setting of its own, plus ``env``."""
    unset = ("WORKBENCH_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")
    return {**{k: v for k, v in os.environ.items() if k not in unset}, **env}


def _child(tmp_path, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "runs")], capture_output=True, text=True,
                          env=_environment(**env), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_reads_the_first_ones_compiled_programs(tmp_path):
    cache = tmp_path / "cache"
    first = _child(tmp_path, WORKBENCH_COMPILATION_CACHE=str(cache))
    second = _child(tmp_path, WORKBENCH_COMPILATION_CACHE=str(cache))
    assert first["hits"] == 0 and first["misses"] > 0  # an empty folder: everything compiled, and written
    assert first["info"]["entries"] == first["misses"]  # every program kept, even those quick to compile
    assert second["misses"] == 0 and second["hits"] == first["misses"]  # nothing compiled again
    assert second["loss"] == first["loss"]  # the programs read back compute the same step
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # JAX runs what it finds there: owner only


@pytest.mark.slow
def test_off_leaves_jax_without_a_cache(tmp_path):
    report = _child(tmp_path, WORKBENCH_COMPILATION_CACHE="off")
    assert report["hits"] == report["misses"] == 0
    assert report["info"]["enabled"] is False and "WORKBENCH_COMPILATION_CACHE='off'" in report["info"]["reason"]


def _info(env: dict) -> dict:
    code = "import json, workbench as wb; print(json.dumps(wb.compile_cache.compilation_cache_info()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_environment(**env),
                          check=True)
    return json.loads(done.stdout)


def test_the_default_folder_is_per_user_under_the_cache_home(tmp_path):
    info = _info({"XDG_CACHE_HOME": str(tmp_path)})
    assert info["enabled"] and info["path"] == str(tmp_path / "sharding-workbench" / "jax")
    assert info["reason"] == "the per-user default folder"


def test_a_folder_given_to_jax_directly_is_left_alone(tmp_path):
    info = _info({"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine"), "XDG_CACHE_HOME": str(tmp_path)})
    assert info["enabled"] and info["path"] == str(tmp_path / "mine") and "left alone" in info["reason"]


def test_a_folder_that_cannot_be_made_switches_the_cache_off_without_failing_the_import(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    info = _info({"WORKBENCH_COMPILATION_CACHE": str(blocker / "cache")})
    assert not info["enabled"] and str(blocker / "cache") in info["reason"]
    assert "set WORKBENCH_COMPILATION_CACHE to a writable folder" in info["reason"]


def test_cli_shows_and_clears_the_cache(tmp_path, capsys, monkeypatch):
    import workbench.compile_cache as compile_cache

    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "jit_step-0123-cache").write_bytes(b"x" * 1000)
    (folder / "jit_step-0123-atime").write_bytes(b"t" * 8)
    monkeypatch.setattr(compile_cache, "_setup", compile_cache.CacheSetup(str(folder), True, "a test folder"))
    assert main(["cache", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["path"], shown["entries"], shown["bytes"]) == (str(folder), 1, 1008)
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert "0 compiled programs" in out and "cleared: 1008 B freed" in out
    assert list(folder.iterdir()) == [] and folder.is_dir()


def test_clearing_deletes_only_jaxs_files_in_a_folder_the_user_shares(tmp_path, monkeypatch):
    import workbench.compile_cache as compile_cache

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".lockfile").write_text("")
    (tmp_path / "jit_step-abcd-cache").write_bytes(b"x" * 100)
    monkeypatch.setattr(compile_cache, "_setup", compile_cache.CacheSetup(str(tmp_path), True, "a shared folder"))
    assert compile_cache.clear_compilation_cache() == 100
    assert sorted(item.name for item in tmp_path.iterdir()) == [".lockfile", "notes.txt"]
