"""The demo's slot-shift case in three lines for the Runs page's first screen (markdown, each linked to the view that
proves it), from backend/demo.py's `Story` figures."""

from __future__ import annotations

from backend import links
from backend.demo import STORY_RUNS, Story

MATCHED, BROKEN, PATCHED, FIXED = STORY_RUNS          # the runs the story's figures come from (backend/demo.py)
FAILURE_RUNS = (MATCHED, BROKEN)
PATCH_RUNS = (FIXED, PATCHED, BROKEN)
FIX_RUNS = (FIXED, BROKEN, MATCHED)


def lines(s: Story) -> list[str]:
    gap = (f", 95% CI {s.gap[0]:.2f} to {s.gap[1]:.2f} lower over {s.gap[2]} held-out prompts" if s.gap else "")
    fix = f" (95% CI {s.fix_gain[0]:.2f} to {s.fix_gain[1]:.2f})" if s.fix_gain else ""
    m, b = s.matched, s.broken
    return [
        f"**The failure.** A drafter trained on speculators <= 0.4 files [embeddings, layer outputs] learned its fc "
        f"slots as S_0, S_3, S_5; SGLang reads its ids [2, 4, 5] after layer and feeds S_3, S_5, S_6, every slot "
        f"shifted: tau {b:.2f}, {m - b:.2f} below the matched drafter's {m:.2f} ({100 * (m - b) / m:.0f}%{gap}) "
        f"and {s.fixed - b:.2f} below its own tau when fed what it was trained on{fix}. "
        f"[Compare]({links.compare(FAILURE_RUNS)})",
        f"**The patch.** Writing id -1 (embeddings) next to the files' own layer names, ids [-1, 3, 5], feeds S_0, "
        f"S_4, S_6: the embedding slot is back, the layer slots are still one late: tau {s.patched:.2f}. "
        f"[Compare]({links.compare(PATCH_RUNS)})",
        f"**What SpecLens names.** The drafter check finds it was trained on "
        f"{', '.join(s.trained_on) if s.trained_on else 'S_0, S_3, S_5'} (S_0 first) and gives the fix, eagle_config "
        f"ids [-1, 2, 4]: tau {s.fixed:.2f}. [Drafter check]({links.drafter_check(s.check)}) · "
        f"[Compare]({links.compare(FIX_RUNS)})",
    ]
