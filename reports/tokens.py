"""Token strings for display: one home for the PDF's strips and the browser view (no plotting
imports, so that the view stays light)."""

from __future__ import annotations


def clean_token(text: str) -> str:
    """Byte-level BPE markers to readable text (Ġ space, Ċ newline, ▁ sentencepiece space)."""
    out = str(text).replace("Ġ", " ").replace("▁", " ").replace("Ċ", "↵").replace("\n", "↵")
    out = out.strip() or "␣"
    return out if len(out) <= 9 else out[:8] + "…"
