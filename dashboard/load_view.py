"""The Serving load page's parts (pages/load.py): one run's caption, tiles, best-K and stops-paying words and its
notes; the words beside the acceptance chart and the definitions. Figures and words: dashboard/load_charts.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import streamlit as st

from backend import metrics
from backend.runs.manifest import StoredManifest
from dashboard import load_charts as lc
from dashboard import ui

# green/red only for a verdict; a noisy baseline (no verdict) and an interval covering 1 are grey without an arrow
TONE = {"slower": "normal", "faster": "normal", "unclear": "off", "none": "off", "noisy": "off"}
NOTE = {"warning": (st.warning, ":material/speed:"), "info": (st.info, ":material/info:")}
ACCEPTANCE_HOW = ("**Two counts of acceptance.** The server's counters (vLLM `spec_decode` drafts, draft tokens and "
                  "accepted tokens; SGLang's equivalents), read from `/metrics` before and after each level, are the "
                  "reference. SpecLens also counts each request's own verification steps from its stream (vLLM: one "
                  "chunk per step; SGLang: the request's `meta_info`); the two agree within 2% when every chunk is "
                  "read in time. Under load vLLM merges the chunks of steps that the client did not read in time, so "
                  "the requests' own count misses steps and reads tau too high (hollow red points).")


@dataclass
class Summary:
    """One run's caption and, unless it is shown instead of the link's run, its tiles, words and notes (computed
    from the catalog's rows alone: pages/load.py keeps it per catalog version, ui.kept)."""

    caption: str
    tiles: list = field(default_factory=list)
    several_configs: bool = False
    best: list[str] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    headline: str = ""
    notes: list = field(default_factory=list)


def summarize(rid: str, c: pd.DataFrame, lv: pd.DataFrame, manifest: StoredManifest, instead: bool) -> Summary:
    """What run_summary shows of run `rid` (its cells `c` and levels `lv`)."""
    caption = lc.run_caption(manifest, lv, c)
    if instead:
        return Summary(caption)
    tiles = lc.tiles(c)
    best = lc.best_lines(c)
    stops = lc.stops_lines(c)
    several = bool(best) and lc.real(c)["config"].nunique() > 1
    return Summary(caption, tiles, several, best, stops, lc.headline(rid, c),
                   [lc.noise_note(c, lv), lc.agreement_note(c)])


def run_summary(rid: str, summary: Summary, multi: bool, instead: bool) -> None:
    """One run: what ran; unless it is shown instead of the link's run, its tiles, words and notes."""
    with st.container(key=f"load_run_{rid}"):
        if multi:
            st.subheader(rid)
        st.caption(summary.caption)
        if instead:
            text = (f"No verdict: `{rid}` is shown instead of the run the link names (see the notice above); its "
                    "charts and tables are below, without tiles or verdict lines.")
            st.info(text, icon=":material/info:")
            ui.note_verdict(text)
            return
        row_tiles = summary.tiles
        for start in range(0, len(row_tiles), 4):
            for col, (i, tile) in zip(st.columns(4), enumerate(row_tiles[start:start + 4], start=start)):
                with col.container(border=True, key=f"tile_{rid}_{i}"):
                    st.metric(tile.label, tile.value, tile.delta, delta_color=TONE.get(tile.tone, "off"),
                              delta_arrow="off" if tile.tone in ("noisy", "unclear") else "auto")
                    st.caption("  \n".join(tile.lines))
        words, stops = summary.best, summary.stops
        if words or stops:
            with st.container(border=True, key=f"verdict_{rid}"):
                if words:
                    st.markdown(("**Best K at each concurrency**" if summary.several_configs
                                 else "**Speedup at each concurrency**") + "  \n" + "  \n".join(words))
                if stops:
                    st.markdown("**Where speculative decoding stops paying**  \n" + "  \n".join(stops))
        ui.note_verdict(summary.headline)
        for note in summary.notes:
            if note is None:
                continue
            kind, text = note
            if kind in NOTE:
                show, icon = NOTE[kind]
                show(text, icon=icon)
            else:
                st.caption(text)


def definitions() -> None:
    """The Definitions expander under the tables."""
    with st.expander("Definitions"):
        st.markdown("\n".join(f"- **{name}**: {text}." for name, text in metrics.SERVING.values()) + "\n"
                    "- **tau**: 1 + accepted draft tokens / drafts, from the server's own counters (a delta of its "
                    "Prometheus `/metrics` around the level); the requests' own count is shown beside it.\n"
                    "- **95% interval** of a speedup: request pairs (same prompt, same position in the order) "
                    "resampled; it covers request-to-request variation, not a drift of the machine between "
                    "measurements: that is what the baseline-noise check looks for.\n"
                    "- **best K**: the highest speedup at a concurrency; the configs whose interval reaches its "
                    "lower bound are within its interval (not a clear winner). **Stops paying**: the lowest "
                    "concurrency where the speedup is below 1.")
