"""The options that ``train``, ``plan`` and ``check`` share, declared once: ``--model``, ``--mesh``, ``--mode``,
``--optimizer``, ``--precision`` and ``--remat``, their choices read from the engine's own tables.

Each command gives its defaults (and, where its words differ, its help); a help not given says the default.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_setup_options(parser, model="mlp", mesh="data=4", mode="dp", optimizer="adam",
    ...                   helps={"mesh": "e.g. data=4 (default)"})
    >>> parser.parse_args(["--mode", "fsdp"]).mode, parser.parse_args([]).mesh
    ('fsdp', 'data=4')
"""

from __future__ import annotations

from collections.abc import Mapping

from ..training.config import OPTIMIZERS
from ..training.models import MODELS
from ..training.modes import MODES, PRECISIONS
from ..training.remat import REMAT_MEANINGS, REMAT_POLICIES

# A default that means "the user must give it".
REQUIRED = object()
# A default that means "this command has no such option".
LEFT_OUT = object()
# The help of a required option, which has no default to name.
_REQUIRED_HELP = {"mesh": "axes as name=size, e.g. data=64,model=8", "mode": "the parallel mode, e.g. fsdp"}


def add_setup_options(parser, *, model: str, mesh: object = LEFT_OUT, mode: object = LEFT_OUT, optimizer: str,
                      precision: str | None = None,
                      remat: object = "none", helps: Mapping[str, str] | None = None) -> None:
    """Add ``--model``, ``--mesh``, ``--mode``, ``--optimizer``, ``--precision`` (when ``precision`` is given) and
    ``--remat`` to an argparse ``parser``, in that order.

    Args:
        model, mesh, mode, optimizer, precision, remat: each option's default; :data:`REQUIRED` makes it required
            (``--mesh`` and ``--mode`` only); :data:`LEFT_OUT` leaves the option out (``recommend`` chooses mesh,
            mode and remat itself).
        helps: option name (``"mesh"``) -> its help, where it should say more than ``default <value>``.

    Example:
        >>> import argparse
        >>> parser = argparse.ArgumentParser()
        >>> add_setup_options(parser, model="transformer", mesh=REQUIRED, mode=REQUIRED, optimizer="adamw",
        ...                   precision="bf16")
        >>> parser.parse_args(["--mesh", "data=8", "--mode", "dp"]).precision
        'bf16'
        >>> parser.parse_args(["--mesh", "data=8", "--mode", "dp", "--remat", "block"]).remat
        'block'
    """
    helps = dict(helps or {})

    def add(name: str, default: object, choices=None) -> None:
        if default is REQUIRED:
            help_text = helps.get(name, _REQUIRED_HELP[name])
            parser.add_argument(f"--{name}", required=True, choices=choices, help=help_text)
        else:
            parser.add_argument(f"--{name}", default=default, choices=choices,
                                help=helps.get(name, f"default {default}"))

    add("model", model, MODELS)
    if mesh is not LEFT_OUT:
        add("mesh", mesh)
    if mode is not LEFT_OUT:
        add("mode", mode, MODES)
    add("optimizer", optimizer, OPTIMIZERS)
    if precision is not None:
        add("precision", precision, PRECISIONS)
    if remat is LEFT_OUT:
        return
    meanings = "; ".join(f"{name}: {REMAT_MEANINGS[name]}" for name in REMAT_POLICIES)
    helps.setdefault("remat", f"what each transformer block keeps for the backward pass ({meanings}; default {remat})")
    add("remat", remat, REMAT_POLICIES)


__all__ = ["LEFT_OUT", "REQUIRED", "add_setup_options"]
