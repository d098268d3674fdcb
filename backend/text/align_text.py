"""An alignment's verdict in words (backend/align.py `Finding`s): one plain sentence per finding, for the command
line (`python -m backend align`, the demo, the training-data check) and the Layer alignment page alike."""

from __future__ import annotations

from backend import coords
from backend.align import MATCH_COS, Alignment, Finding


def _r(x: float) -> str:
    return f"{x:.4f}" if x >= 1e-3 else f"{x:.1e}"


def _other(side: str) -> str:
    return "A" if side == "B" else "B"


def fit_sentence(f: dict, weight_is_target: bool | None) -> str:
    """'B's S_8 is F ...': the final-norm finding of one fit (backend/align.py final_norm_fits), with the target's
    weight when it was read (`weight_is_target`: the fitted weight equals it; None: not compared)."""
    side, other = f["side"], _other(f["side"])
    y, x = f["y"], f["x"]
    text = (f"{side}'s {y} is F (the final norm's output), not {y}: RMSNorm({other}'s {x}) x a fitted per-dimension "
            f"weight matches it to relative L2 {_r(f['rel_l2_norm_fit'])} ({f['tokens']} tokens; the same fit "
            f"without the norm, a per-dimension weight on {other}'s {x} alone: {_r(f['rel_l2_weight_only'])}).")
    tn = f.get("target_norm") or {}
    if "weight_rel" in f:
        g = f"1 + {tn['key']}" if f["weight_plus_one"] else tn["key"]
        if weight_is_target:
            text += (f" The fitted weight equals the target's own final norm weight ({g} of {tn['file']}; relative "
                     f"L2 {_r(f['weight_rel'])}), and RMSNorm({other}'s {x}) x that weight matches {side}'s {y} to "
                     f"{_r(f['rel_l2_target'])}.")
        else:
            text += (f" The fitted weight is not the target's final norm weight ({g} of {tn['file']}; relative L2 "
                     f"{f['weight_rel']:.3f}; with it the match is {f['rel_l2_target']:.3f}): a final norm, but "
                     f"not this target's.")
    elif tn.get("error"):
        text += f" Target's own norm weight not checked: {tn['error']}."
    text += (f" {side} took this state after the final norm and labelled it {y} (S_b is before any final norm; "
             f"SpecForge's hidden_state and HF's last hidden_states entry are F): label it F.")
    return text


def ids_sentence(right: list[str]) -> str:
    """The ids that name these boundaries, in both conventions (docs/CONVENTIONS.md#before-and-after-layer-i)."""
    before = [int(coords.label_index(a)) for a in right]
    text = f"ids {before} read as id a = S_a (vLLM, speculators >= 0.5)"
    if all(i >= 1 for i in before):
        text += f", or {[i - 1 for i in before]} read as id a = S_(a+1) (SGLang, speculators <= 0.4)"
    if before != sorted(before):
        text += "; not ascending, and vLLM always captures its ids in ascending order"
    return text


def _rotation(f: Finding) -> str:
    g = f.figures
    figs = ", ".join(f"{lbl} cos {c:.2f} CKA {k:.3f}" for lbl, c, k in g["shown"])
    return (f"Basis rotation: same-named boundaries carry the same information "
            f"(median CKA {g['median_cka']:.3f}) "
            f"in a different basis (median cosine {g['median_cosine']:.2f}): {figs}. One target was rotated or "
            f"transformed (e.g. QuaRot/SpinQuant); a drafter trained on one will not work on the other.")


def _offset(f: Finding) -> str:
    k = f.figures["offset"]
    bl = ",".join(b for _, b in f.pairs)
    al = ",".join(a for a, _ in f.pairs)
    words = {1: "one", 2: "two", 3: "three"}.get(abs(k), str(abs(k)))
    why = ("B was probably captured 'after layer' where A is 'before layer'" if k > 0 else
           "B was probably captured 'before layer' where A is 'after layer'")
    return (f"Offset by {k:+d}: what B labels {bl} is what A labels {al} "
            f"(off by {words} boundar{'y' if abs(k) == 1 else 'ies'}); "
            f"{why}. Check each producer's id convention.")


def _mislabelled(f: Finding) -> str:
    rows = [(a, b, k) for (a, b), k in zip(f.pairs, f.figures["offsets"], strict=True)]
    kset = sorted({k for _, _, k in rows})
    listing = "; ".join(f"B's {b} -> A's {a} ({'as labelled' if k == 0 else f'{k:+d}'})" for a, b, k in rows)
    kset_text = ", ".join(f"{k:+d}" if k else "0" for k in kset)
    right = [a for a, _, _ in rows]
    return (f"Mislabelled: the ids differ. B's stored states map to A's boundaries with different offsets "
            f"({kset_text}), so no single id convention explains them: the data "
            f"were written with other ids (or in another order) than their labels assume. {listing}. Labelled right, "
            f"B's {','.join(b for _, b, _ in rows)} are {','.join(right)}: {ids_sentence(right)}. Re-import with those "
            f"ids, or fix the producer's ids.")


def _final_norm(f: Finding) -> str:
    a, b = f.pairs[0]
    n = f.figures["n_layers"]
    return (f"Final norm: B's {b} matches A's {a} (cosine {f.figures['cosine']:.4f}), "
            f"so one side took its last state {'after' if a == 'F' else 'before'} the final norm and the other "
            f"{'before' if a == 'F' else 'after'} it (S_{n} is pre-norm, F = norm(S_{n})).")


def _drift(f: Finding) -> str:
    g = f.figures
    return (f"Numeric drift{' growing with depth' if g['grow'] else ''}: the boundaries correspond, "
            f"but relative L2 goes "
            f"from {g['rel_first']:.4f} at {g['first']} to {g['rel_last']:.4f} at {g['last']} "
            f"(worst {g['rel_worst']:.4f} at {g['worst']}; "
            f"A {g['dtype_a']}, B {g['dtype_b']}). Different dtype, quantization or kernels.")


def _aligned(f: Finding) -> str:
    g = f.figures
    rounding = (f"; both {g['dtype']}: that much is 16-bit rounding of different kernels" if g["rounding"] else "")
    return (f"Aligned: all {g['boundaries']} shared boundaries match their namesakes (cosine >= "
            f"{g['min_cosine']:.4f}, relative L2 <= {g['max_rel_l2']:.2e}{rounding}).")


_SENTENCE = {
    "rotation": _rotation, "offset": _offset, "mislabelled": _mislabelled, "final_norm": _final_norm,
    "final_norm_fit": lambda f: "Final norm: " + fit_sentence(f.figures["fit"], f.figures["weight_is_target"]),
    "drift": _drift, "aligned": _aligned,
    "unmatched": lambda f: f"No good match (cosine < {MATCH_COS}) for B's {','.join(f.figures['unmatched'])}.",
    "no_match": lambda f: "The captures share no boundary names and no boundary matches well.",
}


def note_sentence(note: dict) -> str:
    """An F labelled F with no namesake on the other side (backend/align.py `Finding.notes`)."""
    side, other = note["side"], _other(note["side"])
    return (f"{side}'s F has no namesake in {other}; RMSNorm({other}'s {note['x']}) x a fitted per-dimension "
            f"weight matches it to relative L2 {_r(note['rel_l2_norm_fit'])}: it is F, as labelled.")


def nonfinite_sentence(bad: list[list]) -> str:
    """The boundaries whose tokens hold NaN or inf (backend/align.py `Finding.nonfinite`: side, label, tokens)."""
    named = [f"{side} {lbl} ({k})" for side, lbl, k in bad]
    return (f"NaN/inf tokens at {', '.join(named[:6])}{', ...' if len(named) > 6 else ''}: "
            f"left out of those boundaries' figures, never averaged in.")


def finding_sentence(f: Finding) -> str:
    """One finding in words, with what is noted beside it (an honest F, NaN/inf tokens)."""
    text = _SENTENCE[f.case or f.kind](f)
    if f.notes:
        text += " " + " ".join(note_sentence(n) for n in f.notes)
    if f.nonfinite:
        text += " " + nonfinite_sentence(f.nonfinite)
    return text


def verdict_lines(al: Alignment) -> list[tuple[str, str]]:
    """(kind, sentence) of every finding of the verdict, in order."""
    return [(f.kind, finding_sentence(f)) for f in al.verdict]


def headline(al: Alignment) -> str:
    """Every finding of the verdict, one after another."""
    return " ".join(finding_sentence(f) for f in al.verdict)
