"""JAX's persistent compilation cache, switched on by ``import workbench``.

A fresh kernel or process otherwise compiles every training step again. With the cache on, compiled
executables are written to a per-user folder and read back by the next process that builds the same
program (same JAX version, devices and code), so it reaches its first step several times sooner
(``bench/bench_first_step.py`` measures it).

* **Where.** ``$XDG_CACHE_HOME/sharding-workbench/jax`` (``~/.cache/sharding-workbench/jax``), made
  readable by its owner only: JAX loads and runs what it finds there, so it must not be writable by
  other users (see JAX's warning in ``jax.experimental.compilation_cache``).
* **Overrides.** ``WORKBENCH_COMPILATION_CACHE=/some/folder`` uses that folder;
  ``WORKBENCH_COMPILATION_CACHE=off`` switches the cache off. A cache folder the user gave JAX
  already (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is left alone.
* **What is kept.** Every compiled program, however quick to compile (JAX's default keeps only those
  over 1 s, which on CPU is none of a small model's), up to :data:`MAX_BYTES` in all, least recently
  used dropped first. ``workbench cache`` shows the folder and its size; ``workbench cache --clear``
  deletes the compiled programs (JAX's files only: the folder may hold others).

Example:
    >>> import workbench as wb
    >>> wb.compile_cache.compilation_cache_info()["enabled"]
    True
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import jax

ENV_VAR = "WORKBENCH_COMPILATION_CACHE"
OFF_VALUES = ("off", "0", "false", "no", "none")
MAX_BYTES = 2 * 2**30  # least recently used entries go first beyond this
MIN_COMPILE_SECONDS = 0.0  # keep everything: CPU compiles of small steps take well under JAX's 1 s default
ENTRY_SUFFIXES = ("-cache", "-atime")  # JAX's files: a compiled program and its last-use time


@dataclasses.dataclass(frozen=True)
class CacheSetup:
    """What :func:`configure_compilation_cache` did: the folder in use (or None) and why."""

    path: str | None
    enabled: bool
    reason: str


_setup: CacheSetup | None = None


def default_cache_dir() -> pathlib.Path:
    """The per-user default folder: ``$XDG_CACHE_HOME/sharding-workbench/jax`` (``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "sharding-workbench" / "jax"


def _jax_cache_dir() -> str | None:
    """The cache folder JAX has of its own (the user's: JAX_COMPILATION_CACHE_DIR or jax.config), if any."""
    # JAX adds its options to jax.config at run time, as attributes a type checker cannot see.
    return jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]


def _choose() -> tuple[str | None, str]:
    """(folder to use or None, reason) from the environment and JAX's own settings."""
    raw = os.environ.get(ENV_VAR)
    if raw is not None and raw.strip().lower() in OFF_VALUES + ("",):
        if _jax_cache_dir():  # the workbench adds none, but JAX keeps the user's own
            return None, f"{ENV_VAR}={raw!r}, but JAX has a cache folder of its own (JAX_COMPILATION_CACHE_DIR)"
        return None, f"switched off by {ENV_VAR}={raw!r}"
    if raw is not None:
        return os.path.expanduser(raw.strip()), f"folder from {ENV_VAR}"
    if _jax_cache_dir():
        return None, "JAX already has a cache folder (JAX_COMPILATION_CACHE_DIR or jax.config): left alone"
    return str(default_cache_dir()), "the per-user default folder"


def configure_compilation_cache() -> CacheSetup:
    """Switch JAX's persistent compilation cache on (see the module docstring). Called by ``import workbench``.

    Safe to call again: it changes nothing after the first call. A folder that cannot be created
    (read-only home, say) leaves the cache off with the reason, never an import error.

    Example:
        >>> configure_compilation_cache() is configure_compilation_cache()  # the first call's setup, kept
        True
    """
    global _setup
    if _setup is not None:
        return _setup
    path, reason = _choose()
    if path is None:  # whatever JAX was given by the user, if anything, is what is in use
        user_path = _jax_cache_dir() or None
        _setup = CacheSetup(user_path, user_path is not None, reason)
        return _setup
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as error:
        _setup = CacheSetup(None, False, f"cannot create {path} ({error.strerror}): set {ENV_VAR} to a writable folder")
        return _setup
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    _setup = CacheSetup(path, True, reason)
    return _setup


def compilation_cache_info() -> dict:
    """The cache's folder, whether it is on and why, and what it holds (entries and bytes on disk).

    Example:
        >>> info = compilation_cache_info()
        >>> sorted(info)
        ['bytes', 'enabled', 'entries', 'path', 'reason']
    """
    setup = configure_compilation_cache()
    files = _entry_files(setup.path)
    entries = sum(1 for item in files if item.name.endswith("-cache"))
    size = sum(item.stat().st_size for item in files)
    return {"path": setup.path, "enabled": setup.enabled, "reason": setup.reason, "entries": entries, "bytes": size}


def _entry_files(path: str | None) -> list[pathlib.Path]:
    """JAX's cache files in ``path`` (nothing else: the folder may be one the user chose and shares)."""
    if not path or not os.path.isdir(path):
        return []
    return [item for item in pathlib.Path(path).iterdir() if item.is_file() and item.name.endswith(ENTRY_SUFFIXES)]


def clear_compilation_cache() -> int:
    """Delete JAX's compiled programs from the cache folder (the folder, its lock and any other file stay);
    returns the bytes freed.

    The next compile of each program is a full one again. Safe while no other process is compiling.

    Example:
        >>> clear_compilation_cache()  # doctest: +SKIP
        552960
    """
    freed = 0
    for item in _entry_files(configure_compilation_cache().path):
        freed += item.stat().st_size
        item.unlink(missing_ok=True)
    return freed
