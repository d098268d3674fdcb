"""dashboard/figure_spec.py against plotly's object API: the same figure, built once instead of call by call."""

import json

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.figure_spec import FigureSpec, subplots


def _json(fig: go.Figure) -> dict:
    return json.loads(fig.to_json())


def test_lines_bands_and_layout_equal_what_the_object_api_builds():
    ref = go.Figure()
    ref.add_trace(go.Scatter(x=[1, 8, 32], y=[0.9, 1.2, 1.4], mode="lines+markers", name="K=4",
                             line=dict(color="#1f77b4", width=2)))
    ref.add_vrect(x0=8 / 1.25, x1=8 * 1.25, fillcolor="rgba(140,140,140,0.16)", line_width=0, layer="below")
    ref.add_hline(y=1.0, line=dict(color="#555", dash="dash"), annotation_text="1.0x: no gain",
                  annotation_position="bottom left")
    ref.update_layout(height=440, xaxis=dict(type="log", title="concurrency"), legend=dict(orientation="h"))
    ref.update_layout(yaxis=dict(range=[0, 2]))

    spec = FigureSpec()
    spec.add_trace(dict(type="scatter", x=[1, 8, 32], y=[0.9, 1.2, 1.4], mode="lines+markers", name="K=4",
                        line=dict(color="#1f77b4", width=2)))
    spec.add_vrect(x0=8 / 1.25, x1=8 * 1.25, fillcolor="rgba(140,140,140,0.16)")
    spec.add_hline(y=1.0, line=dict(color="#555", dash="dash"), annotation_text="1.0x: no gain")
    spec.update_layout(height=440, xaxis=dict(type="log", title="concurrency"), legend=dict(orientation="h"))
    spec.update_layout(yaxis=dict(range=[0, 2]))
    fig = spec.figure()
    assert isinstance(fig, go.Figure) and _json(fig) == _json(ref)


def test_a_row_of_subplots_equals_make_subplots():
    titles = ["TTFT", "TPOT", "ITL"]
    ref = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.07)
    spec = subplots(3, titles, 0.07)
    for col in (1, 2, 3):
        ref.add_trace(go.Scatter(x=[1, 2], y=[col, col + 1], name=f"s{col}"), row=1, col=col)
        ref.update_yaxes(rangemode="tozero", row=1, col=col)
        spec.add_trace(dict(type="scatter", x=[1, 2], y=[col, col + 1], name=f"s{col}"), row=1, col=col)
        spec.axis("yaxis" if col == 1 else f"yaxis{col}", rangemode="tozero")
    assert _json(spec.figure()) == _json(ref)
    spec.update_layout(height=300)
    assert subplots(3, titles, 0.07).layout.get("height") is None      # the kept grid is never changed by a user


def test_a_line_on_the_second_subplot_and_a_label_above_it_equal_plotly_s():
    ref = make_subplots(rows=1, cols=2, subplot_titles=["a", "b"], horizontal_spacing=0.08)
    spec = subplots(2, ["a", "b"], 0.08)
    for col in (1, 2):                 # plotly leaves a line off a subplot that holds no trace yet
        ref.add_trace(go.Bar(x=["u", "v"], y=[1, 2]), row=1, col=col)
        spec.add_trace(dict(type="bar", x=["u", "v"], y=[1, 2]), row=1, col=col)
    ref.add_hline(y=1.0, line=dict(color="#555", dash="dash"), row=1, col=2)
    ref.add_hline(y=2.0, line=dict(color="#555"), annotation_text="as fast", annotation_position="top left",
                  row=1, col=1)
    spec.add_hline(y=1.0, line=dict(color="#555", dash="dash"), col=2)
    spec.add_hline(y=2.0, line=dict(color="#555"), annotation_text="as fast", annotation_position="top left")
    assert _json(spec.figure()) == _json(ref)
