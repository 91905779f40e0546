"""Run every benchmark in bench/ and print one JSON object per line, then a readable table.

Each ``bench_*.py`` module has ``run() -> list[dict]`` returning records
``{"name", "value", "unit", "target", "ok"}`` (plus optional ``"note"``). Timings are medians of
repeats with warm-up excluded; absolute figures name the machine they were taken on.

    .venv/bin/python bench/run.py [name-filter]
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).parent


def _load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    import workbench  # noqa: F401  (simulated devices before JAX starts)

    sys.path.insert(0, str(HERE))
    pattern = argv[0] if argv else ""
    records = []
    for path in sorted(HERE.glob("bench_*.py")):
        if pattern and pattern not in path.stem:
            continue
        for record in _load(path).run():
            print(json.dumps(record), flush=True)
            records.append(record)
    print()
    print(f"{'benchmark':<48} {'value':>12} {'unit':<8} {'target':<12} ok")
    for r in records:
        print(f"{r['name']:<48} {r['value']:>12.4g} {r['unit']:<8} {str(r['target']):<12} {'yes' if r['ok'] else 'NO'}")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
