"""The drafter check's findings and verdict in words (backend/drafter/lint.py `Finding`: a severity, a `code` and
its `figures`): one plain sentence per finding, the same for `python -m backend check-drafter`, the check.json it
writes (each finding's `text`, beside its data) and the Drafter check page (dashboard/check_charts.py)."""

from __future__ import annotations

import json

from backend.drafter.lint import Finding
from backend.options import engine_label

AT_CHANCE = "Inconclusive: the drafter predicts no better than chance"
NO_FINDER = "The finder did not run; see the findings."


def _b(labels: list[str] | None) -> str:
    return ", ".join(labels) if labels else "-"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


# ---------------------------------------------------------------------------- lint (backend/drafter/lint.py)

def _nested_ids_v2_picked(g: dict) -> str:
    return (f"{g['file']}: ids {g['ids']} are written only in eagle_config; vLLM {g['version']} picks its V2 model "
            f"runner for this target ({g['why']}), which reads only the top-level {g['key']}, ignores them and feeds "
            f"its default {_b(g['v2'])}" + (", which happens to be what the V1 runner reads them as" if g["same"] else
                                            f" (the V1 runner, VLLM_USE_V2_MODEL_RUNNER=0, feeds {_b(g['v1'])})")
            + f". Fix: also write top-level {g['key']}: {g['ids']}.")


def _nested_ids_v1_picked(g: dict) -> str:
    return (f"{g['file']}: ids {g['ids']} are written only in eagle_config; vLLM {g['version']} picks its V1 model "
            f"runner for this target ({g['why']}), which reads them and feeds {_b(g['v1'])}" + (
                "." if g["same"] else
                f"; the V2 runner (VLLM_USE_V2_MODEL_RUNNER=1, or a release that moves this architecture to V2) "
                f"would ignore them and feed its default {_b(g['v2'])}. Fix, to be safe on both runners: "
                f"also write top-level {g['key']}: {g['ids']}."))


def _top_ids_sglang(g: dict) -> str:
    return (f"{g['file']}: ids {g['ids']} are written only at the top level; SGLang reads only "
            f"eagle_config.{g['key']}, ignores them and {'feeds' if g['feeds'] else 'would feed'} its default "
            f"{_b(g['sglang'])}" + (f", where vLLM feeds {_b(g['vllm'])}" if g["vllm"] else "")
            + f". Fix: write eagle_config.{g['key']} as SGLang numbers them (id a -> S_(a+1) for most families).")


def _fc_k_differs(g: dict) -> str:
    k, n = g["k"], g["num_aux"]
    return (f"{g['weights']}: fc.weight takes {k} aux states x {g['target_hidden_size']} but vLLM and SGLang "
            f"build fc for k={n} (from {g['num_aux_source']}; they assume 3 unless "
            f"num_aux_hidden_states or eagle_config ids say otherwise). Fix: add num_aux_hidden_states: {k} "
            f"to {g['file']}.")


def _d2t_out_of_range(g: dict) -> str:
    return (f"{g['weights']}: d2t maps {g['count']} draft id(s) outside the target vocab 0..{g['vocab_size'] - 1} "
            f"(e.g. draft id {g['draft_id']} -> {g['target_id']}): d2t holds offsets (target_id = draft_id + d2t), "
            f"not target ids. Fix: save d2t[i] = target_id(i) - i.")


# field -> (what the release's drafter file lacks, what the drafter is fed instead); "{v}" is the config's value
IGNORED = {
    "norm_before_fc": ("builds no input norm", "un-normed aux states it was not trained on"),
    "fc_norm": ("builds no per-aux fc_norm", "aux states without the per-chunk norm it was trained with"),
    "use_aux_norm": ("builds no per-aux fc_norm for this legacy key",
                     "aux states without the per-chunk norm it was trained with"),
    "norm_before_residual": ("never reads it, the residual is the un-normed fc output",
                             "a residual it was not trained on"),
    # the other fields of the table (tools/rederive_conventions.py MORE_FIELDS)
    "draft_vocab_size": ("never reads it", "an LM head over the whole vocab instead of its {v}-token draft vocab"),
    "d2t": ("never loads d2t", "draft ids taken as target ids"),
    "target_hidden_size": ("never reads it", "an fc built for its own hidden size instead of {v}"),
    "rope_theta": ("never reads rope_theta / rope_parameters", "positions rotated with another base than {v}"),
    "rope_scaling": ("never reads rope_scaling / rope_parameters", "positions without the scaling {v}"),
    "sliding_window": ("never reads sliding_window", "full attention instead of the {v}-token window"),
    "tie_word_embeddings": ("never reads it (the drafter's own lm_head, or the target's when the checkpoint has "
                            "none, scores the draft)", "an LM head other than the tied embedding it was trained with"),
    "head_dim": ("never reads it", "attention heads of hidden_size / num_attention_heads instead of {v}"),
}
_GATED = ("reads sliding_window only for the layers layer_types marks sliding_attention, and this config has none")


def field_cost_words(key: str, c: dict | None) -> str:
    """The measured cost of dropping this field on the toy pair (tools/field_cost.py; `c`: its entry of
    docs/results/field_cost_toy.json, backend/drafter/lint.py field_costs), when there is one."""
    if c is None:
        return ""

    def shown(v) -> str:
        return json.dumps(v) if isinstance(v, bool) or v is None else str(v)
    return (f" Measured on the toy pair (tools/field_cost.py, {c['prompts']} prompts, K={c['k']}): trained with "
            f"{key} {shown(c['trained_with'][key])}, served with {shown(c['served_with'][key])}: tau "
            f"{c['tau_trained']:.2f} -> {c['tau_dropped']:.2f} ({c['difference']:+.2f}, 95% CI {c['ci95'][0]:+.2f} "
            f"to {c['ci95'][1]:+.2f}" + ("; the interval includes 0: not resolved on this pair" if
                                         c["ci95"][0] <= 0 <= c["ci95"][1] else "") + ").")


def _release_ignores_field(g: dict) -> str:
    key, shown = g["key"], g["value"]
    lacks, fed = IGNORED[key]
    if g["gated"]:
        lacks = _GATED
    return (f"{engine_label(g['engine'])} {g['version']} ignores {key}: {shown} ({g['model_file']} {lacks}): "
            f"the drafter will be fed {fed.format(v=shown)}. ({g['file']}; "
            f"backend/drafter_fields.yaml, {g['decided_by']})" + field_cost_words(key, g.get("cost")))


def _norm_before_residual(g: dict) -> str:
    why = (" (absent in this speculators config: vLLM's converter defaults it to True)" if g["defaulted"] else "")
    return (f"{g['file']}: norm_before_residual is true{why}: vLLM uses the normed fc output as "
            f"the residual, SGLang ignores the flag; the two engines run different drafters.")


# ---------------------------------------------------------------------------- the finder's verdict (check_drafter)

def _trained(g: dict) -> str:
    return (f"trained on {', '.join(g['best'])} ({g['convention']}): step-1 accuracy {pct(g['step1'])}, steps "
            f"1..{g['k']} {' / '.join(pct(a) for a in g['accuracy'])}, predicted tau {g['tau']:.2f} at k={g['k']}")


def _got(g: dict) -> str:
    return (f"step-1 accuracy {pct(g['fed_step1'])} instead of {pct(g['step1'])}, predicted tau {g['fed_tau']:.2f} "
            f"instead of {g['tau']:.2f}" if g["fed"] else "not scored")


def _at_chance(g: dict) -> str:
    return (f"{AT_CHANCE} on every one of the {g['candidates']} candidate "
            f"boundary sets (best step-1 accuracy {pct(g['top_step1'])} on {', '.join(g['top'])}, against "
            f"{pct(g['chance'])} for always guessing the target's most frequent next token, {g['slots']} slots), "
            f"so the sample cannot tell which boundaries it was trained on. Its weights may be untrained or random, "
            f"or made for another target or tokenizer. To settle it: check that model.safetensors holds the trained "
            f"weights and that --target is the drafter's own target; with a trained drafter, more prompts "
            f"(--num-prompts) narrow it down.")


def _mismatch(g: dict) -> str:
    fix, b = g["fix"], ", ".join(g["best"])
    fix = (f" Fix: write {fix['where']}: {fix['ids']} in the drafter's config.json." if "where" in fix else
           f" No fix in the config: {fix['refused']}; retrain the drafter on boundaries the engine can feed."
           if "refused" in fix else
           f" No id of {g['name']} captures {b}: retrain the drafter on boundaries the engine can feed.")
    return f"Mismatch: the drafter was {_trained(g)}, but {g['name']} feeds {', '.join(g['feeds'])}: {_got(g)}.{fix}"


def _inconclusive(g: dict) -> str:
    return (f"Inconclusive: the drafter may have been {_trained(g)}; {g['name']} feeds {', '.join(g['feeds'])} "
            f"({_got(g)}), too close to tell apart on this sample (paired z {g['z']:.1f} < {g['sure_z']}); "
            f"add prompts with --num-prompts.")


def _other_engine_differs(g: dict) -> str:
    fix = g["fix"]
    fix = (f" Fix: write {fix['where']}: {fix['ids']}." if "where" in fix else
           f" No fix in the config: {fix['refused']}." if "refused" in fix else "")
    return f"{g['name']} feeds {', '.join(g['feeds'])}, not the trained {', '.join(g['trained'])}.{fix}"


# ---------------------------------------------------------------------------- training data (training_data.py)

def _td_mislabelled(g: dict) -> str:
    from backend.align import Finding as AlignFinding
    from backend.text.align_text import finding_sentence as align_sentence

    wrong = [f"{lbl} is really {h}" for lbl, h in g["wrong"]]
    return (f"The {g['format']} files are mislabelled by their convention: {'; '.join(wrong)} "
            f"(verdict: {', '.join(g['kinds'])}). " + align_sentence(AlignFinding(**g["alignment"])))


def _td_ids(g: dict) -> str:
    return f"ids {g['ids']} from {g['ids_from']}" if g["ids"] else "the producer's default ids"


def _td_disagree(g: dict) -> str:
    labelled = f" (labelled {', '.join(g['labels'])})" if g["labels"] != g["holds"] else ""
    return (f"Training data and serving disagree: the drafter was trained on "
            f"{', '.join(g['holds'])}{labelled} but {g['engine']} feeds {', '.join(g['feeds'])}.")


_SENTENCE = {
    # lint
    "cannot_serve": lambda g: f"{g['name']} cannot serve this drafter as configured: {g['error']}",
    "nested_ids_v2_picked": _nested_ids_v2_picked,
    "nested_ids_v1_picked": _nested_ids_v1_picked,
    "top_ids_sglang": _top_ids_sglang,
    "top_and_nested_ids_differ": lambda g: (
        f"{g['file']}: top-level ids {g['top']} and eagle_config ids {g['nested']} differ: vLLM reads the "
        f"top-level ones, SGLang the eagle_config ones (fine when each is written in that engine's numbering)."),
    "engines_differ": lambda g: "The engines feed different boundaries: " + "; ".join(
        f"{name} {_b(list(b))}" for name, b in g["fed"]) + (". At most one of them is what the drafter was "
                                                           "trained on; the finder (check-drafter without "
                                                           "--lint-only) says which."),
    "negative_ids": lambda g: (f"{g['file']}: negative id(s) {g['ids']}: vLLM never captures them (silently), SGLang "
                               f"reads -1 as the embeddings (S_0)."),
    "ids_not_ascending": lambda g: (f"{g['file']}: ids {g['ids']} are not ascending; vLLM concatenates aux states in "
                                    f"ascending layer order whatever the order written."),
    "config_only": lambda g: (f"No model.safetensors next to {g['file']}: fc width, d2t, embeddings and LM head were "
                              f"not checked (config only)."),
    "fc_k_differs": _fc_k_differs,
    "k_from_nested_ids": lambda g: (
        f"{g['file']}: k={g['k']} aux states is known only from the length of eagle_config ids "
        f"({g['num_aux_source']}); vLLM's V2 runner takes ids from the top level only. Fix: add "
        f"num_aux_hidden_states: {g['k']}."),
    "fc_width": lambda g: (f"{g['weights']}: fc.weight {g['fc']} does not take a multiple of the target hidden "
                           f"size {g['target_hidden_size']}; use the drafter trained for this target."),
    "d2t_out_of_range": _d2t_out_of_range,
    "d2t_collisions": lambda g: (f"{g['weights']}: d2t maps {g['count']} draft id(s) onto target ids already taken; "
                                 f"those draft tokens can never be told apart."),
    "d2t_zeros": lambda g: (f"{g['weights']}: d2t is all zeros with a draft vocab of {g['draft_vocab_size']}: "
                            f"the draft vocab is the first {g['draft_vocab_size']} target ids."),
    "no_embed_tokens": lambda g: "The checkpoint has no embed_tokens: both engines use the target's embeddings.",
    "no_lm_head": lambda g: (f"{g['weights']}: no lm_head.weight: vLLM would start from an uninitialised LM head; "
                             f"SGLang uses the target's only without draft_vocab_size."),
    "release_ignores_field": _release_ignores_field,
    "norm_before_residual": _norm_before_residual,
    "norm_before_fc": lambda g: (f"{g['file']}: norm_before_fc is true: vLLM applies input_norm before fc, SGLang "
                                 f"has no input_norm and skips it."),
    "tie_word_embeddings": lambda g: (f"{g['file']}: tie_word_embeddings is true: SGLang uses the embedding as the LM "
                                      f"head (logits over the whole vocab), vLLM ignores the flag and uses lm_head."),
    "norm_output": lambda g: (f"{g['file']}: norm_output is true: vLLM and SGLang feed the normed state to the next "
                              f"draft step; SpecForge reads the flag as 'norm before lm_head'."),
    "no_draft_vocab_size": lambda g: (f"{g['file']}: no draft_vocab_size: SGLang then takes the target's LM head, "
                                      f"vLLM uses the drafter's own lm_head over the full vocab."),
    "embeddings_equal": lambda g: (f"The drafter's embed_tokens equal the target's (relative difference "
                                   f"{g['rel']:.1e}): SGLang's substitution changes nothing."),
    "embeddings_differ": lambda g: (
        f"The drafter's embed_tokens differ from the target's (relative difference {g['rel']:.2f}): vLLM uses the "
        f"drafter's, SGLang substitutes the target's, so the engines draft differently; the finder uses "
        f"{g['engine']}'s choice."),
    # the finder (backend/check_drafter.py)
    "sglang_cannot_load": lambda g: (f"SGLang cannot load the {g['format']} format; the finder runs the drafter with "
                                     f"vLLM's semantics instead."),
    "finder_skipped_d2t": lambda g: ("The finder did not run: fix d2t first (draft ids would map outside the target "
                                     "vocab)."),
    "no_candidate": lambda g: "no candidate could be scored",
    "at_chance": _at_chance,
    "cannot_serve_trained": lambda g: (f"The drafter was {_trained(g)}. {g['name']} cannot serve it as configured: "
                                       f"{g['error']}"),
    "match": lambda g: f"Match: {g['name']} feeds {', '.join(g['feeds'])}; the drafter was {_trained(g)}.",
    "inconclusive": _inconclusive,
    "mismatch": _mismatch,
    "other_engine_matches": lambda g: f"{g['name']} feeds {', '.join(g['feeds'])}: what the drafter was trained on.",
    "other_engine_differs": _other_engine_differs,
    "ranked_by_step1": lambda g: (
        f"By step-1 accuracy alone {', '.join(g['top'])} ranks first ({pct(g['top_step1'])} vs "
        f"{pct(g['first_step1'])}); the ranking uses the cross-entropy against the target's distribution, which "
        f"tells candidates apart with far fewer tokens."),
    # training data (backend/training_data.py)
    "td_labels_right": lambda g: (f"The {g['format']} files hold what their producer's convention says "
                                  f"({', '.join(g['labels'])}, {_td_ids(g)}): checked against a fresh capture of the "
                                  f"same {g['tokens']} tokens."),
    "td_mislabelled": _td_mislabelled,
    "td_rotated": lambda g: ("The training data come from a rotated or transformed copy of this target: no boundary "
                             "set will serve this drafter well."),
    "td_agree": lambda g: (f"Training data and serving agree: the drafter was trained on {', '.join(g['holds'])} "
                           f"and {g['engine']} feeds {', '.join(g['feeds'])}."),
    "td_disagree": _td_disagree,
    "td_not_best": lambda g: (f"The finder's best candidate ({', '.join(g['best'])}) is not what these training "
                              f"files hold ({', '.join(g['holds'])}): the files may not be this drafter's training "
                              f"data."),
}
CODES = frozenset(_SENTENCE)


def finding_sentence(f: Finding) -> str:
    """One finding of the drafter check in words."""
    return _SENTENCE[f.code](f.figures)


def finding_json(f: Finding) -> dict:
    """A finding as check.json stores it: its data and its sentence (`text`, which older check files hold alone)."""
    return {"severity": f.severity, "code": f.code, "figures": f.figures, "source": f.source,
            "text": finding_sentence(f)}


def stored_text(f: dict) -> str:
    """The sentence of a stored finding (a check.json `findings` entry): worded from its code and figures when it has
    them, else the `text` an older check file holds."""
    if f.get("code") in CODES and isinstance(f.get("figures"), dict):
        return _SENTENCE[f["code"]](f["figures"])
    return f.get("text", "")


def lint_verdict(readings: list[dict], runner: str, reason: str, architectures: list[str]) -> str:
    """A lint-only check's verdict: what each engine feeds (the picked readings, as check.json's `lint` rows) and the
    vLLM runner (backend/vllm_runner.py `RunnerChoice`)."""
    fed = "; ".join(f"{r['name']} feeds {', '.join(r['boundaries'])}" if r["boundaries"] else
                    f"{r['name']} cannot serve it" + (f" (it would capture {', '.join(r['captures'])})"
                                                      if r["captures"] else "")
                    for r in readings if r["picked"])
    words = (f" vLLM runs its {runner.upper()} model runner for {'/'.join(architectures) or 'this target'}"
             f" ({reason}).")
    return (f"Lint only (config files, no model loaded): {fed}.{words} Whether the drafter was trained on "
            f"these is not checked: run check-drafter without --lint-only (loads the target and the drafter) "
            f"to find out.")
