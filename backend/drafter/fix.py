"""Write the fix a drafter check found: a drafter directory whose config makes one engine release (and the runner it
picks) feed the boundaries the drafter was trained on.

    plan = plan_fix(report)                 # from a full check's report; FixRefused (one line) when it cannot
    out = write_fix(plan, OUT)              # config.json with the ids where that release reads them, the other
                                            # files linked (or copied) unchanged, FIX.md; re-linted before it returns

What a release reads and how it numbers ids comes from the conventions table (backend/coords.py,
backend/conventions.yaml) through the lint (backend/drafter/lint.py): vLLM's V2 runner reads only the top-level
`eagle_aux_hidden_state_layer_ids`, its V1 runner the top level and then `eagle_config`, SGLang only `eagle_config`,
and each adds its own offset. A fix is refused, in one line that says what would settle it, when the check could
not tell what the drafter was trained on (lint only, at chance, inconclusive), when nothing needs fixing, or when no
ids can make that release feed those boundaries (e.g. S_0 on a release that cannot capture the embeddings).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from backend.drafter.kinds import SPECULATORS_IDS
from backend.errors import SpecLensError
from backend.options import SERVING_ENGINES, engine_label

IDS_KEY = "eagle_aux_hidden_state_layer_ids"


class FixRefused(SpecLensError):
    """No fix is written; the message says why and what would settle it."""


@dataclass
class FixPlan:
    drafter: str                    # the drafter directory the check ran on
    target: str
    engine: str                     # "vllm" | "sglang"
    version: str
    runner: str | None              # vLLM runner the release picks for the target
    where: str                      # "top-level" | "eagle_config" | DFLASH_WHERE | SPECULATORS_WHERE (where_key)
    ids: list[int]
    trained_on: list[str]           # boundaries the check found the drafter was trained on
    fed_before: list[str] | None    # what the release fed the original config
    check_run: str | None = None
    verdict: str = ""
    before: dict = field(default_factory=dict)   # ids as written: {"top-level": .., "eagle_config": ..}
    config_file: str = ""           # the config read (a drafter directory's config.json, or a config file alone)

    @property
    def engine_name(self) -> str:
        eng = engine_label(self.engine)
        return f"{eng} {self.version}" + (f" ({self.runner.upper()} runner)" if self.runner else "")

    def to_json(self) -> dict:
        return asdict(self)


INCONCLUSIVE = ("inconclusive", "at_chance", "no_finder")   # verdict codes that cannot say what it was trained on


def _first_sentence(text: str) -> str:
    return (text.split(". ")[0] if text else "").rstrip(".")


def plan_fix(report: dict) -> FixPlan:
    """The fix of a full drafter check (backend/check_drafter.py's report), or FixRefused."""
    from backend.drafter import lint as L

    if report.get("mode") == "lint":
        raise FixRefused("no fix written: a lint-only check does not know what the drafter was trained on; run "
                         "check-drafter without --lint-only (it loads the target and the drafter)")
    best = report.get("best_candidate")
    verdict = report.get("verdict") or ""
    code = report.get("verdict_code")         # the verdict finding's code (a check.json written before it: its words)
    inconclusive = code in INCONCLUSIVE if code else verdict.startswith("Inconclusive")
    if best is None or inconclusive:
        why = _first_sentence(verdict) or "the finder did not run"
        raise FixRefused(f"no fix written: the check is inconclusive ({why[:160]}); more prompts (--num-prompts) or "
                         "the drafter's training data (--training-data) would settle what it was trained on")
    cfg, target, _ = L.load(report["drafter"], report["target"], weights_required=False)
    return plan_for(cfg, target, list(best["boundaries"]), report["engine"], report.get("engine_version"),
                    report.get("runner"), check_run=report.get("run_id"), verdict=verdict)


def plan_for(cfg, target, trained: list[str], engine: str, version: str | None = None, runner: str | None = None,
             check_run: str | None = None, verdict: str = "") -> FixPlan:
    """The fix that makes `engine` `version` feed `trained` (boundary labels) to this drafter config on this target:
    from a check's finder, or from what the user knows (`check-drafter --trained-on S_2,S_16,S_29`, e.g. the
    trainer's convention). FixRefused when nothing needs fixing or no ids can do it."""
    from backend.drafter import lint as L
    from backend.drafter.kinds import DFLASH_LIKE, EAGLE_LIKE, KIND_NAMES

    kind = getattr(cfg, "kind", "eagle3")
    if kind not in EAGLE_LIKE + DFLASH_LIKE:
        raise FixRefused(f"no fix written: a {KIND_NAMES.get(kind, kind)} drafter reads no layer ids (it is fed the "
                         f"target's last hidden state), so no ids can change what it is fed")
    focus = _reading(cfg, target, engine, version, runner)
    if focus.boundaries == trained:
        raise FixRefused(f"nothing to fix: {focus.name} already feeds {', '.join(trained)}, what the drafter was "
                         "trained on")
    if kind in DFLASH_LIKE:
        return _plan_dflash(cfg, target, focus, trained, check_run, verdict)
    ids = L.ids_for(focus, trained, target)
    after = _reading_with_ids(cfg, target, focus, ids) if ids is not None else None
    if ids is None or after.boundaries != trained:
        # the ids alone do not do it: none exist, or the release still cannot serve the drafter with them (a format
        # it does not load, an fc built for another number of aux states) or feeds something else
        why = "" if after is None else (
            f" (with ids {ids} it still cannot serve this drafter: {(after.error or '').split(';')[0]})"
            if after.boundaries is None else f" (ids {ids} would make it feed {', '.join(after.boundaries)})")
        can = [r.name for r in _all_readings(cfg, target) if _ids_fix(cfg, target, r, trained)]
        alt = (f"; ids can for {', '.join(can[:4])}{' ...' if len(can) > 4 else ''}" if can else
               "; no release in the conventions table can with ids alone: fix what stops it serving the drafter"
               if after is not None and after.boundaries is None else
               "; no release in the conventions table can: retrain the drafter on boundaries the engine can feed")
        raise FixRefused(f"no fix written: no ids make {focus.name} feed {', '.join(trained)}{why}{alt}")
    return FixPlan(drafter=str(Path(cfg.name).resolve()), target=str(Path(target.path).resolve()),
                   engine=focus.engine, version=focus.version, runner=focus.runner,
                   where="eagle_config" if focus.engine == "sglang" else "top-level", ids=ids, trained_on=trained,
                   fed_before=focus.boundaries, check_run=check_run, verdict=verdict,
                   before={"top-level": cfg.aux_layer_ids_top, "eagle_config": cfg.aux_layer_ids_nested},
                   config_file=str(Path(cfg.config_file).resolve()))


DFLASH_WHERE = "dflash_config.target_layer_ids"
SPECULATORS_WHERE = SPECULATORS_IDS     # speculators' DFlash format: vLLM copies it over its own key


def where_key(where: str, style: str = "prefix") -> str:
    """The config key a plan's `where` names, as messages show it: `top-level eagle_aux_hidden_state_layer_ids`
    (style "suffix": `eagle_aux_hidden_state_layer_ids (top level)`), `eagle_config.eagle_aux_hidden_state_layer_ids`,
    `dflash_config.target_layer_ids`, or speculators' top-level `aux_hidden_state_layer_ids`."""
    if where == "top-level":
        return f"{IDS_KEY} (top level)" if style == "suffix" else f"top-level {IDS_KEY}"
    if where == "eagle_config":
        return f"eagle_config.{IDS_KEY}"
    if where == SPECULATORS_WHERE:
        return f"{SPECULATORS_WHERE} (top level, speculators format)" if style == "suffix" else \
            f"top-level {SPECULATORS_WHERE} (speculators format)"
    return where


def _plan_dflash(cfg, target, focus, trained: list[str], check_run: str | None, verdict: str) -> FixPlan:
    """A DFlash drafter's fix: vLLM reads top-level eagle_aux_hidden_state_layer_ids first in every release (id a =
    S_a); SGLang reads dflash_config.target_layer_ids (id t = S_{t+1} on most targets) (backend/drafter/kinds.py).
    A speculators-format config gets vLLM's ids in its own aux_hidden_state_layer_ids (same meaning): vLLM's
    speculators reader writes that key over eagle_aux_hidden_state_layer_ids, so an id put there would be lost."""
    from backend.drafter.kinds import fix_ids

    try:
        key, ids = fix_ids(cfg.kind, focus.engine, focus.version, trained, target.architectures)
    except SpecLensError as e:
        raise FixRefused(str(e)) from None
    raw = _raw_of(cfg)
    where = DFLASH_WHERE if key != IDS_KEY else SPECULATORS_WHERE if "speculators_config" in raw else "top-level"
    key = SPECULATORS_WHERE if where == SPECULATORS_WHERE else key
    after = _reading_with_ids(cfg, target, focus, ids, where)
    if after.boundaries != trained:
        got = ", ".join(after.boundaries) if after.boundaries else f"nothing ({_first_clause(after.error)})"
        raise FixRefused(f"no fix written: with {key} = {ids}, {focus.name} would feed {got}, not {', '.join(trained)}")
    return FixPlan(drafter=str(Path(cfg.name).resolve()), target=str(Path(target.path).resolve()),
                   engine=focus.engine, version=focus.version, runner=focus.runner, where=where, ids=ids,
                   trained_on=trained, fed_before=focus.boundaries, check_run=check_run, verdict=verdict,
                   before={"top-level": cfg.aux_layer_ids_top,
                           DFLASH_WHERE: (raw.get("dflash_config") or {}).get("target_layer_ids"),
                           **({SPECULATORS_WHERE: raw.get(SPECULATORS_WHERE)} if where == SPECULATORS_WHERE else {})},
                   config_file=str(Path(cfg.config_file).resolve()))


def _first_clause(error: str | None) -> str:
    """An engine reading's error up to its first ';' (its source citation follows), its brackets closed."""
    text = (error or "").split(";")[0].strip()
    return text + ")" * (text.count("(") - text.count(")"))


def _raw_of(cfg) -> dict:
    f = cfg.config_file or str(Path(cfg.name) / "config.json")
    return json.loads(Path(f).read_text())


def _reading(cfg, target, engine: str, version: str | None, runner: str | None):
    from backend.drafter import lint as L
    from backend.vllm_runner import resolve

    versions = {engine: version} if version else {}
    choice = None
    if engine == "vllm":
        choice = resolve(runner or "auto", target.architectures, version or "0.24.0", target_config=target.raw or None)
    return L.picked(L.engine_readings(cfg, target, versions, choice), engine)


def _reading_with_ids(cfg, target, reading, ids: list[int], where: str | None = None):
    """`reading`'s release and runner on this drafter config with `ids` written where that release reads them: what
    write_fix's re-lint will find, known before a plan is offered."""
    from backend.drafter.config import config_from_dict

    f = cfg.config_file or str(Path(cfg.name) / "config.json")
    raw = json.loads(Path(f).read_text())
    where = where or ("eagle_config" if reading.engine == "sglang" else "top-level")
    fixed = config_from_dict(_with_ids(raw, where, ids), f)
    fixed.name, fixed.config_file = cfg.name, cfg.config_file
    return _reading(fixed, target, reading.engine, reading.version, reading.runner)


def _ids_fix(cfg, target, reading, trained: list[str]) -> bool:
    """Whether some ids make `reading`'s release feed `trained` to this drafter (and it can then serve it)."""
    from backend.drafter import lint as L

    ids = L.ids_for(reading, trained, target)
    if ids is None:
        return False
    try:
        return _reading_with_ids(cfg, target, reading, ids).boundaries == trained
    except (SpecLensError, OSError, ValueError):
        return False


def _all_readings(cfg, target) -> list:
    """The reading of every engine release in the conventions table (the runner each vLLM release picks)."""
    from backend import coords

    out = []
    for engine in SERVING_ENGINES:
        for rel in coords.releases(engine):
            try:
                out.append(_reading(cfg, target, engine, rel, None))
            except SpecLensError:
                continue
    return out


def fixed_config(raw: dict, plan: FixPlan) -> dict:
    """The drafter's config.json with the plan's ids where its release reads them (nothing else changed)."""
    return _with_ids(raw, plan.where, plan.ids)


def _with_ids(raw: dict, where: str, ids: list[int]) -> dict:
    new = json.loads(json.dumps(raw))
    if where == SPECULATORS_WHERE:
        new[SPECULATORS_WHERE] = list(ids)
    elif where == DFLASH_WHERE:
        nested = new.get("dflash_config") if isinstance(new.get("dflash_config"), dict) else {}
        new["dflash_config"] = {**nested, "target_layer_ids": list(ids)}
    elif where == "eagle_config":
        nested = new.get("eagle_config") if isinstance(new.get("eagle_config"), dict) else {}
        new["eagle_config"] = {**nested, IDS_KEY: list(ids)}
    else:
        new[IDS_KEY] = list(ids)
    return new


def _link_or_copy(src: Path, dst: Path) -> str:
    try:
        os.link(src, dst)
        return "linked"
    except OSError:
        shutil.copy2(src, dst)
        return "copied"


def write_fix(plan: FixPlan, out: str | Path) -> Path:
    """Write the fixed drafter directory `out` (refused when it exists and is not empty) and its FIX.md; the fixed
    config is linted again and must make the release feed what the drafter was trained on."""
    from backend.drafter import lint as L
    from backend.feeds import matrix

    src, out = Path(plan.drafter), Path(out)
    if out.resolve() == src.resolve():
        raise FixRefused(f"--write-fix {out}: that is the drafter itself; write the fix to a new directory")
    if out.exists() and any(out.iterdir()):
        raise FixRefused(f"--write-fix {out}: the directory exists and is not empty; pick a new one")
    cfg_file = Path(plan.config_file) if plan.config_file else src / "config.json"
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecLensError(f"{cfg_file}: cannot read the drafter config ({e}); point --drafter at the drafter "
                            "directory") from None
    out.mkdir(parents=True, exist_ok=True)
    how = {}
    if cfg_file.name == "config.json":            # a drafter directory: its other files come along unchanged
        for f in sorted(src.iterdir()):
            if f.is_file() and f.name not in ("config.json", "FIX.md"):
                how[f.name] = _link_or_copy(f, out / f.name)
    tmp = out / ".config.json.tmp"
    tmp.write_text(json.dumps(fixed_config(raw, plan), indent=2) + "\n")
    os.replace(tmp, out / "config.json")
    cfg, target, _ = L.load(out, plan.target, weights_required=False)
    got = _reading(cfg, target, plan.engine, plan.version, plan.runner).boundaries
    if got != plan.trained_on:
        shutil.rmtree(out, ignore_errors=True)
        raise SpecLensError(f"the fixed config would make {plan.engine_name} feed {', '.join(got or ['nothing'])}, "
                            f"not {', '.join(plan.trained_on)}: no fix written (a SpecLens bug; report it)")
    m = matrix(out, plan.target, trained={"boundaries": plan.trained_on, "run_id": plan.check_run},
               look_up_check=False)
    (out / "FIX.md").write_text(fix_text(plan, m, how))
    return out


def _ranges(rows: list[dict], what) -> list[str]:
    """Consecutive releases of one engine with the same outcome as one item: 'vLLM 0.20.0-0.21.0 (feeds S_2, ...)'."""
    out: list[str] = []
    run: list[dict] = []

    def flush() -> None:
        if run:
            eng = engine_label(run[0]["engine"])
            span = run[0]["release"] + (f"-{run[-1]['release']}" if len(run) > 1 else "")
            out.append(f"{eng} {span}{what(run[0])}")

    for r in rows:
        if run and (r["engine"] != run[-1]["engine"] or what(r) != what(run[-1])
                    or rows.index(r) != rows.index(run[-1]) + 1):
            flush()
            run = []
        run.append(r)
    flush()
    return out


def fix_text(plan: FixPlan, m: dict, how: dict[str, str]) -> str:
    """FIX.md: what changed, why, and for which engine releases it holds."""
    key = where_key(plan.where, "suffix")
    was = plan.before.get(plan.where)
    rows = [r for r in m["rows"] if r["picked"]]
    holds = _ranges([r for r in rows if r["trained"] == "matches"], lambda r: "")
    def fed(r: dict) -> str:
        if r["feeds"]:
            return f" (feeds {', '.join(r['feeds'])})"
        why = re.sub(rf"(?i){re.escape(r['engine'])} {re.escape(r['release'])} ", "", (r["error"] or "").split(";")[0])
        return f" (cannot serve it: {why})"

    fails = _ranges([r for r in rows if r["trained"] != "matches"], fed)
    lines = [
        "# The fix SpecLens wrote",
        "",
        f"Changed: `{key}` from {was if was is not None else 'absent'} to {plan.ids} in config.json. Nothing else"
        + (": " + ", ".join(f"{n} {h}" for n, h in how.items()) + " unchanged from " + plan.drafter if how else
           f" (the config alone was given: {plan.config_file}; copy the weights beside it)") + ".",
        "",
        ("Why: it was trained on " + ", ".join(plan.trained_on) + " (given with --trained-on)"
         if plan.verdict.endswith("(given with --trained-on)") else
         f"Why: the drafter check{' ' + plan.check_run if plan.check_run else ''} found it was trained on "
         f"{', '.join(plan.trained_on)}")
        + f", and {plan.engine_name} fed the original config "
        f"{', '.join(plan.fed_before) if plan.fed_before else 'nothing'}. {plan.engine_name} reads these ids "
        f"from {key} and now feeds {', '.join(plan.trained_on)}.",
        "",
        f"Holds for: {'; '.join(holds) if holds else 'no release in the table'}.",
        "",
        f"Does not hold for: {'; '.join(fails) if fails else 'none'}.",
        "",
        "Each row is what that release feeds the fixed config with the runner it picks for this target, read from the "
        "conventions table (`python -m backend feeds --drafter THIS_DIR --target TARGET`). Prove it with "
        "`python -m backend check-drafter ... --write-fix OUT --prove` (benches the original and this fix against "
        "one paired baseline).",
        "",
    ]
    return "\n".join(lines)
