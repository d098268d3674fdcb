"""A plotly figure written as plotly's own JSON spec (traces and layout as dicts) and validated once at the end.

plotly's object API validates every property again on each `add_trace`, `update_layout` and `go.Scatter(...)`; the
Serving-load view's four figures built that way took 172 ms, built here 64 ms (bench/page_server_bench.py,
docs/PERFORMANCE.md). The charts
build a FigureSpec with the few calls they use and hand `figure()` (a real go.Figure, validated by plotly in one pass)
to Streamlit and the exports, so nothing downstream changes.
"""

from __future__ import annotations

from functools import lru_cache

import plotly.graph_objects as go


def merge(into: dict, new: dict) -> dict:
    """Deep-merge `new` into `into` (dicts merged key by key, anything else replaced), as update_layout does."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v
    return into


def axis_ref(letter: str, col: int = 1) -> str:
    """How a trace or shape names subplot `col`'s axis: "x" for the first, "x2", "x3", ... after it."""
    return letter if col == 1 else f"{letter}{col}"


def axis_name(letter: str, col: int = 1) -> str:
    """The layout key of subplot `col`'s axis: "xaxis", "xaxis2", ..."""
    return f"{letter}axis" if col == 1 else f"{letter}axis{col}"


class FigureSpec:
    """Traces and layout as plotly dicts; `figure()` builds the go.Figure once."""

    def __init__(self, layout: dict | None = None):
        self.data: list[dict] = []
        self.layout: dict = merge({}, layout or {})

    def add_trace(self, trace: dict, row: int | None = None, col: int | None = None) -> FigureSpec:
        """A trace dict with its `type` (e.g. dict(type="scatter", x=..., y=...)); on a subplot grid made by
        `subplots`, row/col pick its axes."""
        t = dict(trace)
        if col is not None:
            if (row or 1) != 1:
                raise ValueError("FigureSpec grids have one row")
            t["xaxis"], t["yaxis"] = axis_ref("x", col), axis_ref("y", col)
        self.data.append(t)
        return self

    def update_layout(self, **layout) -> FigureSpec:
        merge(self.layout, layout)
        return self

    def axis(self, name: str, **props) -> FigureSpec:
        """Merge props into one axis ("xaxis", "yaxis2", ...)."""
        merge(self.layout.setdefault(name, {}), props)
        return self

    def add_hline(self, y: float, line: dict, annotation_text: str | None = None,
                  annotation_position: str = "bottom left", col: int = 1) -> FigureSpec:
        """A horizontal line across the plot (subplot `col` of a grid) at y, its label at its left end below ("bottom
        left") or above it ("top left"), as go.Figure.add_hline draws them."""
        if annotation_position not in ("bottom left", "top left"):
            raise ValueError(f"annotation_position {annotation_position!r}: 'bottom left' or 'top left'")
        x, yref = f"{axis_ref('x', col)} domain", axis_ref("y", col)
        self.layout.setdefault("shapes", []).append(dict(type="line", xref=x, x0=0, x1=1, yref=yref, y0=y, y1=y,
                                                         line=line))
        if annotation_text:
            self.layout.setdefault("annotations", []).append(dict(
                text=annotation_text, xref=x, x=0, xanchor="left", yref=yref, y=y,
                yanchor="top" if annotation_position == "bottom left" else "bottom", showarrow=False))
        return self

    def add_vrect(self, x0: float, x1: float, fillcolor: str) -> FigureSpec:
        """A band over the full height between x0 and x1, below the traces."""
        self.layout.setdefault("shapes", []).append(dict(type="rect", xref="x", x0=x0, x1=x1, yref="y domain", y0=0,
                                                         y1=1, fillcolor=fillcolor, line=dict(width=0), layer="below"))
        return self

    def figure(self) -> go.Figure:
        return go.Figure(data=self.data, layout=self.layout)


@lru_cache(maxsize=16)
def _grid(cols: int, titles: tuple[str, ...], spacing: float, shared_yaxes: bool) -> dict:
    from plotly.subplots import make_subplots

    return make_subplots(rows=1, cols=cols, subplot_titles=list(titles), horizontal_spacing=spacing,
                         shared_yaxes=shared_yaxes).layout.to_plotly_json()


def subplots(cols: int, titles: list[str], spacing: float, shared_yaxes: bool = False) -> FigureSpec:
    """One row of `cols` subplots with titles, the axes and title annotations plotly's make_subplots lays out
    (computed once per shape and kept)."""
    import copy

    return FigureSpec(copy.deepcopy(_grid(cols, tuple(titles), spacing, shared_yaxes)))


def axis_names(spec: FigureSpec, letter: str) -> list[str]:
    """The layout's axes of one letter ("x" -> ["xaxis", "xaxis2", ...]), what update_xaxes() without row/col
    reaches."""
    return sorted((k for k in spec.layout if k.startswith(f"{letter}axis")), key=lambda k: int(k[5:] or 1))
