"""Run every benchmark in bench/ and print one JSON object per line, then a readable table.

Each ``bench_*.py`` module has ``run() -> list[dict]`` returning records
``{"name", "value", "unit", "target", "ok", "note"}`` (see :func:`timing.record`). Timings are ratios
measured side by side in one run, or absolute figures whose note names the machine; medians of repeats,
warm-up excluded. The exit status is 1 if any target is missed.

    make bench                          # everything (about 7 minutes on 2 cores, 10 with the tpu extra; the
                                        # notebooks add ~2, the GPU/TPU memory matrix ~4 after make gpu-compile)
    .venv/bin/python bench/run.py modes  # only the benchmarks whose file name contains "modes"
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).parent
UNIT_FORMATS = {"x": "{:.3f}", "s": "{:.3f}", "MiB": "{:.0f}"}


def _load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table(records: list[dict]) -> str:
    """The records as an aligned text table: name, value, unit, target and whether it is met."""
    width = max(len(r["name"]) for r in records)
    lines = [f"{'benchmark':<{width}}  {'value':>9} {'unit':<4} {'target':<12} ok"]
    for r in records:
        value = UNIT_FORMATS.get(r["unit"], "{:.4g}").format(r["value"])
        ok = "NO" if not r["ok"] else ("yes" if r["target"] else "-")
        lines.append(f"{r['name']:<{width}}  {value:>9} {r['unit']:<4} {r['target'] or 'reported':<12} {ok}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import workbench  # noqa: F401  (simulated devices before JAX starts)

    sys.path.insert(0, str(HERE))
    from timing import machine

    pattern = argv[0] if argv else ""
    records, start = [], time.perf_counter()
    for path in sorted(HERE.glob("bench_*.py")):
        if pattern and pattern not in path.stem:
            continue
        for record in _load(path).run():
            print(json.dumps(record), flush=True)
            records.append(record)
    if not records:
        print(f"no benchmark file in {HERE} matches {pattern!r}", file=sys.stderr)
        return 2
    missed = [r["name"] for r in records if not r["ok"]]
    print()
    print(table(records))
    print(f"\n{len(records)} figures in {time.perf_counter() - start:.0f} s on {machine()}; "
          + (f"{len(missed)} target(s) missed: {', '.join(missed)}" if missed else "every target met"))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
