"""Views of layout records: text tables, JAX's own picture, plotly figures, the device colours."""
