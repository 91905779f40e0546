"""The workbench's FigureWidget: a view made late gets the figure as it is now, and plotly's 5 MB front end is
sent once per page on request, not with every figure (the browser tests see the figures draw)."""

from __future__ import annotations

import json

import plotly.graph_objects as go

from widgets.figure_widget import BUNDLE, LOADER, FigureWidget, replace_figure


def test_a_view_made_after_changes_gets_the_figure_as_it_is_now():
    figure = FigureWidget()
    figure.add_scatter(x=[1, 2], y=[3, 4], name="loss")
    with figure.batch_update():
        figure.data[0].y = [5, 6]
    figure.update_layout(title_text="after")
    state = figure.get_state()  # what a browser that connects now (Voila, a reloaded page) is sent
    assert [trace["name"] for trace in state["_widget_data"]] == ["loss"]
    assert list(state["_widget_data"][0]["y"]) == [5, 6] and state["_widget_layout"]["title"]["text"] == "after"


def test_each_figure_carries_a_small_loader_and_the_bundle_is_sent_on_request():
    figures = [FigureWidget() for _ in range(3)]
    sizes = [len(json.dumps(figure.get_state()["_esm"])) for figure in figures]
    assert all(size < 5_000 for size in sizes)  # plotly's own front end is 5 MB: once per page, not per figure
    assert "_send_bundle" in LOADER and "_resend_figure" in LOADER

    sent = []
    figure = figures[0]
    figure.send = lambda content, buffers=None: sent.append((content, buffers or []))
    figure._handle_custom_msg({"id": "1", "kind": "anywidget-command", "name": "_send_bundle", "msg": {}}, [])
    (content, buffers), = sent
    assert content == {"id": "1", "kind": "anywidget-command-response", "response": {"bytes": BUNDLE.stat().st_size}}
    assert buffers == [BUNDLE.read_bytes()] and b"export{" in buffers[0]


def test_a_resend_pushes_the_current_figure_before_its_answer():
    figure = FigureWidget()
    figure.add_bar(x=["a"], y=[1])
    messages = []
    figure._send = lambda message, buffers=None: messages.append(message)  # every comm message, in order
    figure._handle_custom_msg({"id": "2", "kind": "anywidget-command", "name": "_resend_figure", "msg": {}}, [])
    assert [message["method"] for message in messages] == ["update", "custom"]
    assert messages[0]["state"]["_widget_data"][0]["type"] == "bar"
    assert messages[1]["content"]["id"] == "2"


def test_replace_figure_updates_in_place():
    widget = FigureWidget()
    replace_figure(widget, go.Figure(go.Bar(x=["a"], y=[1]), layout={"title": {"text": "bytes"}}))
    replace_figure(widget, go.Figure(go.Scatter(x=[1], y=[2])))
    assert [trace.type for trace in widget.data] == ["scatter"] and widget.layout.title.text is None
