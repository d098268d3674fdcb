"""Layer alignment: which boundary of run A matches which boundary of run B (?a=&b=&metric=)."""

import streamlit as st

from backend.align import MATCH_COS, get_alignment
from dashboard import align_words, charts, ui

st.title("Layer alignment")
runs = ui.load_runs()
ids = ui.complete_captures(runs)
ui.need_captures(ids, 1)
ui.unknown_runs(["a", "b"], ids, runs)

default_a, default_b = ui.default_pair(ids)
c1, c2, c3 = st.columns([2, 2, 1])
a = ui.select("Run A (reference, rows)", ids, "a", default_a, where=c1)
b = ui.select("Run B (columns)", ids, "b", default_b, where=c2)
metric = ui.select("Metric", list(charts.METRICS), "metric", "cosine", where=c3,
                   format_func=lambda m: charts.METRICS[m][0])

with st.spinner(f"Aligning {a} with {b} ..."):
    al = ui.guarded(get_alignment, a, b)

ui.verdict_banner(align_words.banners(al))
ui.warning_list(al.warnings)
st.caption(f"{al.tokens} tokens shared by both samples (same token in the same context); {align_words.cka_words(al)}. "
           f"Red squares: B's best match in A by cosine (monotone in stream order), "
           f"drawn where that cosine is at least {MATCH_COS}. Colours: {charts.alignment_scale_note(metric)}; "
           "the same fixed scale for every pair, so two pairs' heatmaps compare (docs/DASHBOARD.md).")

ui.chart_with_downloads(charts.alignment_heatmap(al, metric), charts.alignment_long(al),
                        f"alignment_{a}_vs_{b}_{metric}")

st.subheader("Per boundary of B")
st.dataframe(charts.alignment_table(al), hide_index=True, key="per_boundary",
             column_config={**{c: st.column_config.NumberColumn(format="%.4f")
                               for c in ("best cosine", "cosine (same name)", "CKA (same name)")},
                            "rel L2 (same name)": st.column_config.NumberColumn(format="%.2e")})
