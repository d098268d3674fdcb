"""The Layer alignment page's words about an alignment (backend/align.py `Alignment`): how its CKA figures were
computed, and the verdict. backend/align.py returns the figures and the findings as data; backend/text/align_text.py
words the findings once, for the command line (backend/__main__.py) and this page alike."""

from __future__ import annotations

from backend.align import CKA_SE_BOUND, Alignment
from backend.text import align_text


def cka_words(al: Alignment) -> str:
    """How the CKA figures were computed, short: exact on all tokens, or estimated with its bound."""
    if al.cka_exact:
        return "CKA exact on all shared tokens"
    return (f"CKA estimated from {al.cka_tokens} Gram rows over all tokens, within {CKA_SE_BOUND:g} standard "
            f"errors of the exact value (largest standard error {al.cka_se_max:.4f})")


def banners(al: Alignment) -> list[tuple[str, str]]:
    """(kind, sentence) of each finding: the page's verdict banners (dashboard/ui.py verdict_banner)."""
    return align_text.verdict_lines(al)


def headline(al: Alignment) -> str:
    """Every finding of the verdict, one after another."""
    return align_text.headline(al)
