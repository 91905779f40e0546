"""The ipywidgets UI over :mod:`workbench`'s public API (mesh picker, spec editor, inspector, dashboard).

Widgets only present what the engine computes: anything a widget does, a script or the CLI can do too.
"""
