"""The empirical finder: which target boundaries was this drafter trained on? Ask the drafter itself.

1. `sample_target`: the target answers a prompt sample greedily (HF engine); one forward over each prompt + answer
   captures every boundary S_0..S_N, F and the target's next-token distribution at every answer position.
2. `candidate_sets`: boundary sets worth trying (what each engine feeds, one boundary earlier and later, with S_0,
   with S_N or F last, the common defaults, both readings of the written ids).
3. `evaluate`: the drafter fed one candidate, teacher-forced over the answer slots and unrolled for draft steps
   1..K exactly as vLLM's proposer drafts (step 1 from fc(aux), steps 2..K from the drafter's own hidden;
   `backend.drafter.unroll.ttt_forward`, checked against `Eagle3Drafter.prefill/step` in the tests):
   top-1 agreement with the target per step, per-position acceptance (steps 1..j all right; on the target's own
   greedy text this is the chain acceptance a greedy engine would see), tau = 1 + their sum, and the soft
   cross-entropy against the target's distribution (the EAGLE-3 training loss; its mean over steps ranks the
   candidates: far less noisy than top-1 on a small sample, z-scores in the tens on the toy pair).
4. `find`: evaluate the sets, then search around the best (each boundary one earlier or later, S_N <-> F) while a
   neighbour is better with paired z >= SEARCH_Z.

Shapes: T tokens of one sequence (P prompt), H_T target width, k aux states, K draft steps, V target vocab.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backend import coords
from backend.errors import SpecLensError

if TYPE_CHECKING:
    import torch

    from backend.drafter.model import Eagle3Drafter
    from backend.hf_model import LoadedModel

SEARCH_Z = 3.0          # a neighbour replaces the best only when its cross-entropy is lower with paired z >= this
SEARCH_ROUNDS = 3
SURE_Z = 2.0            # below this paired z two candidates are not told apart by the sample


@dataclass
class TargetSample:
    """The target on a prompt sample: its greedy answers, every boundary, its next-token distributions."""
    tokens: list[torch.Tensor]               # [T] int64: prompt + the target's greedy answer
    prompt_lens: list[int]                     # P per sequence
    states: list[dict[str, torch.Tensor]]    # label (S_0..S_N, F) -> [T, H_T]
    logprobs: list[torch.Tensor]             # [T - P, V]: log p_target(. | x_0..x_pos) at pos = P..T-1
    n_layers: int

    @property
    def answer_tokens(self) -> int:
        return sum(len(t) - p for t, p in zip(self.tokens, self.prompt_lens))


def sample_target(lm: LoadedModel, prompts: list[list[int]], new_tokens: int, batch_size: int = 16) -> TargetSample:
    """Greedy answers of up to `new_tokens` tokens, then one forward per sequence with every boundary hooked."""
    import torch

    from backend.hf_model import BoundaryHooks, default_boundaries
    from backend.hf_model import generate_greedy as generate

    seqs = generate(lm, prompts, new_tokens, batch_size=batch_size)
    bounds = default_boundaries(lm)
    labels = coords.labels(bounds)
    out = TargetSample([], [], [], [], lm.n_layers)
    got: dict[int, torch.Tensor] = {}
    with BoundaryHooks(lm, bounds, lambda k, x: got.__setitem__(k, x)), torch.inference_mode():
        for p, s in zip(prompts, seqs):
            got.clear()
            logits = lm.model(input_ids=torch.tensor([s], device=lm.device), use_cache=False).logits[0]   # [T, V]
            P = len(p)
            out.tokens.append(torch.tensor(s, device=lm.device))
            out.prompt_lens.append(P)
            out.states.append({lbl: got[k].float() for k, lbl in enumerate(labels)})
            out.logprobs.append(logits[P:].float().log_softmax(-1))
    return out


# ---------------------------------------------------------------------------- candidates

def _valid(labels: Iterable[str], n: int) -> bool:
    """Every label a boundary of this target: S_0..S_N or F (a shift below S_0 or past S_N is not)."""
    try:
        return all(lbl == "F" or 0 <= coords.label_index(lbl) <= n for lbl in labels)
    except SpecLensError:                      # e.g. 'S_-1' from shifting S_0 one boundary earlier
        return False


def _norm(labels: Iterable[str], n: int) -> tuple[str, ...] | None:
    """Ascending, distinct, in range; None when not a valid set."""
    labels = list(labels)
    if len(set(labels)) != len(labels) or not _valid(labels, n):
        return None
    return tuple(sorted(labels, key=lambda lbl: n + 0.5 if lbl == "F" else coords.label_index(lbl)))


def _shift(labels: Iterable[str], d: int) -> list[str]:
    return [lbl if lbl == "F" else coords.S(int(coords.label_index(lbl)) + d).label for lbl in labels]


def candidate_sets(n: int, k: int, fed: list[tuple[str, list[str]]], focus: list[str] | None,
                   written: list[tuple[str, list[int]]]) -> dict[tuple[str, ...], list[str]]:
    """Boundary sets of size k to try, each with the reasons it is on the list.

    fed: (engine reading's name, the boundaries it feeds); focus: what the chosen engine feeds; written: (where,
    ids) of the ids written in the config."""
    out: dict[tuple[str, ...], list[str]] = {}

    def add(labels: Iterable[str], why: str) -> None:
        key = _norm(labels, n)
        if key is not None and len(key) == k:
            out.setdefault(key, [])
            if why not in out[key]:
                out[key].append(why)

    for name, labels in fed:
        add(labels, f"{name} feeds")
    defaults = [2, n // 2, n - 3] if k == 3 else None
    if defaults:
        add([coords.S(a).label for a in defaults], f"EAGLE / vLLM default ids {defaults} (before layer)")
        add([coords.S(a + 1).label for a in defaults], f"default ids {defaults} after layer (speculators <= 0.4)")
    for where, ids in written:
        add([coords.S(a).label for a in ids], f"{where} ids {ids} read before layer (id a -> S_a)")
        add([coords.S(a + 1).label for a in ids], f"{where} ids {ids} read after layer (id a -> S_a+1)")
    if focus:
        add(_shift(focus, -1), "one boundary earlier than the engine feeds")
        add(_shift(focus, +1), "one boundary later than the engine feeds")
        add(["S_0", *focus[1:]], "S_0 (the embeddings) first")
        # speculators <= 0.4 files [S_0, a, b, c] read by standardize_data_v1: fc got [S_0, a, b], so an engine that
        # feeds [a, b, c] (or [S_0, a+1, b+1] after a "-1 = embeddings" patch) shifts every slot by one
        add(["S_0", *focus[:-1]], "S_0 (the embeddings) first, every slot one place later (embeddings-first files)")
        if focus[0] == "S_0":
            add(["S_0", *_shift(focus[1:], -1)], "S_0 first, the layer slots one boundary earlier")
        add([*focus[:-1], coords.S(n).label], f"S_{n} (top of the stack, before the final norm) last")
        add([*focus[:-1], "F"], "F (after the final norm) last")
    for key in list(out):
        if coords.S(n).label in key:
            add(["F" if lbl == coords.S(n).label else lbl for lbl in key], f"F in place of S_{n}")
    return out


def neighbours(labels: tuple[str, ...], n: int) -> list[tuple[str, ...]]:
    """Each boundary one earlier or one later (S_N <-> F too), the others kept."""
    out = []
    for i, lbl in enumerate(labels):
        moves = [coords.S(n).label] if lbl == "F" else ["F"] if lbl == coords.S(n).label else []
        if lbl != "F":
            b = int(coords.label_index(lbl))
            moves += [coords.S(c).label for c in (b - 1, b + 1) if 0 <= c <= n]     # stay inside S_0..S_N
        for m in moves:
            key = _norm([*labels[:i], m, *labels[i + 1:]], n)
            if key is not None and len(key) == len(labels) and key not in out:
                out.append(key)
    return out


# ---------------------------------------------------------------------------- evaluation

@dataclass
class Candidate:
    boundaries: list[str]
    why: list[str]
    accuracy: list[float] = field(default_factory=list)     # top-1 agreement with the target, draft steps 1..K
    acceptance: list[float] = field(default_factory=list)   # steps 1..j all right (per-position acceptance)
    tau: float | None = None                                # 1 + sum(acceptance): mean acceptance length at K
    cross_entropy: float | None = None                      # soft CE vs the target, mean over steps (nats)
    z: float | None = None                                  # paired z of (CE - best's CE) over tokens; 0 for the best
    tokens: int = 0
    ce_tokens: torch.Tensor | None = field(default=None, repr=False)    # [M] per-slot CE, for paired tests

    @property
    def step1(self) -> float | None:
        return self.accuracy[0] if self.accuracy else None

    def to_json(self) -> dict:
        r = lambda x: None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(x, 6)  # noqa: E731
        return {"boundaries": self.boundaries, "why": self.why, "step1_accuracy": r(self.step1),
                "accuracy": [r(a) for a in self.accuracy], "acceptance": [r(a) for a in self.acceptance],
                "tau": r(self.tau), "cross_entropy": r(self.cross_entropy), "z_vs_best": r(self.z),
                "tokens": self.tokens}


def evaluate(d: Eagle3Drafter, sample: TargetSample, labels: list[str], steps: int) -> Candidate:
    """The drafter fed `labels` (ascending), teacher-forced over the answer slots of every sequence.

    Slot t holds token x_{t+1} and the aux states of position t; draft step j (0-based) at slot t predicts x_{t+2+j}
    and is scored against the target's distribution at position t+1+j. Slots t = P-1 .. T-1-K: every step exists.
    A DFlash drafter (backend/drafter/dflash.py) is scored block by block instead (`evaluate_block`)."""
    import torch

    from backend.drafter.unroll import ttt_forward

    if getattr(d, "kind", "eagle3") == "dflash":
        return evaluate_block(d, sample, labels, steps)

    dtype = d.fc.weight.dtype
    hits, ces = [], []
    with torch.inference_mode():
        for tok, P, st, lp in zip(sample.tokens, sample.prompt_lens, sample.states, sample.logprobs):
            T = len(tok)
            if T - 1 - steps < P - 1:
                continue
            aux = torch.cat([st[lbl] for lbl in labels], -1)[None].to(dtype)            # [1, T, k*H_T]
            slots = torch.arange(P - 1, T - steps, device=tok.device)                    # [M]
            sel = torch.zeros(1, T, dtype=torch.bool, device=tok.device)
            sel[0, slots] = True
            out = ttt_forward(d, aux, tok[None], steps, [sel] * steps)                  # K x [M, V_d]
            h, c = [], []
            for j in range(steps):
                lq = d.target_logits(out[j].float()).log_softmax(-1).clamp_min(-1e4)    # [M, V]
                tp = lp[slots + 1 + j - P]                                               # [M, V]
                h.append(lq.argmax(-1) == tp.argmax(-1))
                c.append(-(tp.exp() * lq).sum(-1))
            hits.append(torch.stack(h))                                                  # [K, M]
            ces.append(torch.stack(c))
    if not hits:
        return Candidate(list(labels), [], tokens=0)
    H = torch.cat(hits, 1).float().cpu()                                                 # [K, M]
    C = torch.cat(ces, 1).float().cpu()
    acc = H.mean(1).tolist()
    accept = H.cumprod(0).mean(1).tolist()
    return Candidate(list(labels), [], accuracy=acc, acceptance=accept, tau=1 + sum(accept),
                     cross_entropy=float(C.mean()), tokens=int(H.shape[1]), ce_tokens=C.mean(0))


def evaluate_block(d, sample: TargetSample, labels: list[str], steps: int, chunk: int = 128) -> Candidate:
    """A DFlash drafter fed `labels`: one block per anchor s = P .. T-K of every answer, as its block draft step makes
    it (context slots 0..s-1 from the target's states, the block [x_s, M..M]); draft position j (1-based) predicts
    x_{s+j} and is scored against the target's distribution at position s+j-1. Anchor s is the slot t = s-1 of
    `evaluate`, so the two score the same next tokens and share `chance`; K = min(steps, block size - 1)."""
    import torch

    K = min(steps, d.cfg.block_size - 1)
    hits, ces = [], []
    with torch.inference_mode():
        for tok, P, st, lp in zip(sample.tokens, sample.prompt_lens, sample.states, sample.logprobs):
            T = len(tok)
            if T - K < P:
                continue
            aux = torch.cat([st[lbl] for lbl in labels], -1)                                # [T, k*H_T]
            for a in torch.arange(P, T - K + 1, device=tok.device).split(chunk):             # anchors [A]
                lq = d.block_logits(aux, tok, a)[:, :K].float().log_softmax(-1).clamp_min(-1e4)  # [A, K, V]
                tp = lp[a[:, None] + torch.arange(K, device=tok.device)[None, :] - P]           # [A, K, V]
                hits.append((lq.argmax(-1) == tp.argmax(-1)).T)                              # [K, A]
                ces.append((-(tp.exp() * lq).sum(-1)).T)
    if not hits:
        return Candidate(list(labels), [], tokens=0)
    H = torch.cat(hits, 1).float().cpu()                                                 # [K, M]
    C = torch.cat(ces, 1).float().cpu()
    accept = H.cumprod(0).mean(1).tolist()
    return Candidate(list(labels), [], accuracy=H.mean(1).tolist(), acceptance=accept, tau=1 + sum(accept),
                     cross_entropy=float(C.mean()), tokens=int(H.shape[1]), ce_tokens=C.mean(0))


def written_ids(cfg) -> list[tuple[str, list[int]]]:
    """(where, ids) of the ids written in a drafter config: EAGLE-3's top-level and eagle_config ids, and a DFlash
    drafter's dflash_config.target_layer_ids (candidates read both ways: id t -> S_t and S_t+1)."""
    out = [(w, ids) for w, ids in (("top-level", cfg.aux_layer_ids_top), ("eagle_config", cfg.aux_layer_ids_nested))
           if ids]
    if getattr(cfg, "kind", "eagle3") in ("dflash", "dflash2"):
        from backend.drafter.kinds import raw_config

        raw = raw_config(cfg)
        ids = (raw.get("dflash_config") or {}).get("target_layer_ids") or raw.get("target_layer_ids")
        if ids:
            out.append(("dflash_config.target_layer_ids", [int(t) for t in ids]))
    return out


@dataclass
class Chance:
    """What a predictor that ignores the hidden states scores on the sample: always the most frequent next token."""
    accuracy: float            # step-1 top-1 agreement of that predictor with the target
    token: int                 # the token it always guesses
    slots: int

    def beaten_by(self, c: Candidate) -> bool:
        """`c` predicts clearly better than chance: step-1 accuracy above chance by more than 3 standard errors
        (and at least one point)."""
        if c.step1 is None or c.tokens == 0:
            return False
        se = math.sqrt(max(self.accuracy * (1 - self.accuracy), 1.0 / c.tokens) / c.tokens)
        return c.step1 > self.accuracy + max(3 * se, 0.01)

    def to_json(self) -> dict:
        return {"accuracy": round(self.accuracy, 6), "token": self.token, "slots": self.slots}


def chance(sample: TargetSample, steps: int) -> Chance:
    """The always-the-most-frequent-token baseline on the slots `evaluate` scores at step 1."""
    import torch

    nxt = [lp[: max(len(tok) - steps - P + 1, 0)].argmax(-1) for tok, P, lp in
           zip(sample.tokens, sample.prompt_lens, sample.logprobs)]                # the target's next token per slot
    allx = torch.cat(nxt) if nxt else torch.zeros(0, dtype=torch.long)
    if allx.numel() == 0:
        return Chance(0.0, -1, 0)
    vals, counts = allx.unique(return_counts=True)
    i = int(counts.argmax())
    return Chance(float(counts[i]) / allx.numel(), int(vals[i]), int(allx.numel()))


def paired_z(worse: Candidate, better: Candidate) -> float:
    """z of mean(CE_worse - CE_better) over the same slots (large: `better` is really better)."""
    if worse.ce_tokens is None or better.ce_tokens is None or len(worse.ce_tokens) != len(better.ce_tokens):
        return float("nan")
    diff = worse.ce_tokens - better.ce_tokens
    if len(diff) < 2:
        return float("nan")
    sd = float(diff.std())
    return float(diff.mean()) / (sd / math.sqrt(len(diff))) if sd > 0 else (
        0.0 if float(diff.mean()) == 0 else math.copysign(float("inf"), float(diff.mean())))


def find(d: Eagle3Drafter, sample: TargetSample, sets: dict[tuple[str, ...], list[str]], steps: int,
         search: bool = True, progress: bool = False) -> list[Candidate]:
    """Every set evaluated (and the neighbours of the best while one is clearly better), best first."""
    from tqdm import tqdm

    done: dict[tuple[str, ...], Candidate] = {}
    bar = tqdm(total=len(sets), desc="finder", unit="candidate", disable=not progress, file=sys.stderr)

    def run(key: tuple[str, ...], why: list[str]) -> Candidate:
        if key not in done:
            c = evaluate(d, sample, list(key), steps)
            c.why = list(why)
            done[key] = c
            bar.update(1)
        return done[key]

    for key, why in sets.items():
        run(key, why)
    best = min(done.values(), key=lambda c: c.cross_entropy if c.cross_entropy is not None else math.inf)
    for _ in range(SEARCH_ROUNDS if search else 0):
        todo = [nb for nb in neighbours(tuple(best.boundaries), sample.n_layers) if nb not in done]
        if not todo:
            break
        bar.total += len(todo)
        moved = False
        for nb in todo:
            c = run(nb, [f"search: next to {', '.join(best.boundaries)}"])
            if c.cross_entropy is not None and c.cross_entropy < best.cross_entropy and paired_z(best, c) >= SEARCH_Z:
                best, moved = c, True
        if not moved:
            break
    bar.close()
    ranked = sorted(done.values(), key=lambda c: c.cross_entropy if c.cross_entropy is not None else math.inf)
    for c in ranked:
        c.z = 0.0 if c is ranked[0] else paired_z(c, ranked[0])
    return ranked


# ---------------------------------------------------------------------------- words

def convention_of(labels: list[str], written: list[tuple[str, list[int]]], n: int) -> str:
    """The reading of the written (or default) ids that gives `labels`, in words."""
    tries = list(written) + [("default", [2, n // 2, n - 3])]
    for where, ids in tries:
        if len(ids) != len(labels):
            continue
        what = f"the {where} ids {ids}" if where != "default" else f"the default ids {ids}"
        if where.startswith("dflash_config"):             # docs/CONVENTIONS.md#dflash
            if [coords.S(a + 1).label for a in sorted(ids)] == labels:
                return (f"the DFlash trainers' reading of {what} (id t -> HF hidden_states[t+1] = S_t+1, the output "
                        f"of layer t: z-lab, SpecForge)")
            if [coords.S(a).label for a in sorted(ids)] == labels:
                return (f"{what} read as HF hidden_states[t] = S_t (the input of layer t: one layer early, the "
                        f"'layer offset' mistake)")
        if [coords.S(a).label for a in sorted(ids)] == labels:
            return f"'before layer' reading of {what} (id a -> S_a: vLLM, EAGLE, speculators >= 0.5)"
        if [coords.S(a + 1).label for a in sorted(ids)] == labels:
            return f"'after layer' reading of {what} (id a -> S_a+1: SGLang, SpecForge, speculators <= 0.4)"
        if labels[0] == "S_0" and [coords.S(a + 1).label for a in sorted(ids)[:-1]] == labels[1:]:
            return (f"S_0 (the embeddings) first, then the outputs of layers {sorted(ids)[:-1]}: speculators <= 0.4 "
                    f"files [embeddings, outputs of layers {sorted(ids)}] whose last state became the teacher "
                    f"(standardize_data_v1), so every slot sits one place later than {what} read after layer")
    if "F" in labels:
        return "a set that ends at F, after the final norm (the normed output, not a layer output)"
    return "boundaries that match no common reading of the written or default ids"
