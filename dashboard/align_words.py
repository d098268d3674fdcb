"""The Layer alignment page's words about an alignment (backend/align.py `Alignment`): how its CKA figures were
computed, and the verdict as one line. backend/align.py returns the figures; the command line words them in
backend/__main__.py."""

from __future__ import annotations

from backend.align import CKA_SE_BOUND, Alignment


def cka_words(al: Alignment) -> str:
    """How the CKA figures were computed, short: exact on all tokens, or estimated with its bound."""
    if al.cka_exact:
        return "CKA exact on all shared tokens"
    return (f"CKA estimated from {al.cka_tokens} Gram rows over all tokens, within {CKA_SE_BOUND:g} standard "
            f"errors of the exact value (largest standard error {al.cka_se_max:.4f})")


def headline(al: Alignment) -> str:
    """Every finding of the verdict, one after another."""
    return " ".join(f.text for f in al.verdict)
