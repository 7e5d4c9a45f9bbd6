"""The store's public contract: dimension names, variables, their dims and definitions.

Collaborators, later analyses and the README rely on these names; change them only with
a new :data:`SCHEMA_VERSION`.

Layouts
-------
``dense``   every (query, key) array is stored whole: ``alpha`` etc. on (..., query, key).
``compact`` (query, key) arrays are kept only for the sink keys ``key < k`` (same names, on
            the ``sink`` dimension instead of ``key``: coordinate ``sink = 0..k-1`` is the
            key position; ``key`` stays the full dimension of per-key variables) and for a tail window of the ``w`` most recent
            non-sink keys up to each query, on the ``lag`` dimension (``key = query - lag``)
            with a ``tail_`` prefix. Per-query totals over the remaining (middle) keys are
            stored as ``middle_*``. Every per-key and per-query variable is kept.

Cells outside a sequence's ``length``, outside the attention mask, or (tail) falling on a
sink key are NaN.
"""

from __future__ import annotations

from .vocab import COMPACT, FLOAT32, LAYOUTS, PACKED

SCHEMA_VERSION = 1
FORMAT_NAME = "attngeom-store"

SEQUENCE, LAYER, HEAD, POSITION, QUERY, KEY, LAG, SINK = (
    "sequence", "layer", "head", "position", "query", "key", "lag", "sink")

# variable names (their definitions are the dicts below)
ALPHA, COSINE, COSINE_LAYER, CONTRIBUTION, CONTRIBUTION_LAYER = (
    "alpha", "cosine", "cosine_layer", "contribution", "contribution_layer")
VALUE_NORM, SINK_VALUE_COSINE = "value_norm", "sink_value_cosine"
OUTPUT_NORM, RESIDUAL_NORM, SINK_RESIDUAL_COSINE, HEAD_SHARE = (
    "output_norm", "residual_norm", "sink_residual_cosine", "head_share")
LAYER_OUTPUT_NORM = "layer_output_norm"
TOKEN_ID, TOKEN, SPECIAL, LENGTH, TRUNCATED, FINITE, TEXT_INDEX = (
    "token_id", "token", "special", "length", "truncated", "finite", "text_index")
TAIL_PREFIX, MIDDLE_PREFIX = "tail_", "middle_"   # compact: tail_alpha, middle_alpha, ...
MIDDLE_COUNT = "middle_count"

PAIR = (SEQUENCE, LAYER, HEAD, QUERY, KEY)
TAIL = (SEQUENCE, LAYER, HEAD, QUERY, LAG)
SINK_PAIR = (SEQUENCE, LAYER, HEAD, QUERY, SINK)  # compact layout of the pair variables
PER_KEY = (SEQUENCE, LAYER, HEAD, KEY)
PER_QUERY = (SEQUENCE, LAYER, HEAD, QUERY)
PER_LAYER_QUERY = (SEQUENCE, LAYER, QUERY)

# name -> (dims, definition). Pair variables exist in both layouts (compact: key < k only).
PAIR_VARIABLES: dict[str, str] = {
    "alpha": "attention weight alpha_ij^h after softmax and masks",
    "cosine": "cos(o_i^h, v~_j^h): alignment of the projected value with the head output",
    "cosine_layer": "cos(o_i, v~_j^h): alignment of the projected value with the layer output",
}
DERIVED_PAIR_VARIABLES: dict[str, str] = {
    "contribution": "c_ij^h = alpha * value_norm * cosine / output_norm; sums to 1 over keys",
    "contribution_layer": (
        "C_ij^h = alpha * value_norm * cosine_layer / layer_output_norm; "
        "sums to 1 over heads and keys"),
}
PER_KEY_VARIABLES: dict[str, str] = {
    "value_norm": "||v~_j^h||, norm of the projected value v_j^h W_O^h (model space)",
    "sink_value_cosine": "cos(v~_0^h, v~_j^h): alignment of each value with the sink's value",
}
PER_QUERY_VARIABLES: dict[str, str] = {
    "output_norm": "||o_i^h||, norm of the head output sum_j alpha_ij v~_j^h (no output bias)",
    "residual_norm": "||r_i^h||, r_i^h = o_i^h - sum_{j<k} alpha_ij v~_j^h (non-sink part)",
    "sink_residual_cosine": "cos(v~_0^h, r_i^h): alignment of the sink value with r_i^h",
    "head_share": "sum_j C_ij^h = <o_i, o_i^h> / ||o_i||^2, the head's share of the layer output",
}
# only in stores of models with learned sink logits (gpt-oss ``s_aux``): a virtual key with no
# value that joins the softmax, so alpha over the real keys sums to 1 - learned_sink_alpha
LEARNED_SINK_VARIABLES: dict[str, str] = {
    "learned_sink_alpha": (
        "weight of the model's learned sink logit (a virtual key with no value, gpt-oss "
        "s_aux) in the softmax; sum_j alpha_ij^h + learned_sink_alpha = 1 over the real keys"),
}
PER_LAYER_QUERY_VARIABLES: dict[str, str] = {
    "layer_output_norm": "||o_i||, norm of the layer output sum_h o_i^h (no output bias)",
}
TAIL_VARIABLES: dict[str, str] = {
    f"tail_{name}": f"{text} (tail window, key = query - lag)"
    for name, text in PAIR_VARIABLES.items()
}
DERIVED_TAIL_VARIABLES: dict[str, str] = {
    f"tail_{name}": f"{text} (tail window, key = query - lag)"
    for name, text in DERIVED_PAIR_VARIABLES.items()
}
DERIVED = tuple(DERIVED_PAIR_VARIABLES) + tuple(DERIVED_TAIL_VARIABLES)
MIDDLE_VARIABLES: dict[str, str] = {
    "middle_alpha": ("sum of alpha over middle keys (neither sink nor tail): "
                     "1 - learned_sink_alpha - sink keys - tail keys"),
    "middle_contribution": "sum of contribution over middle keys",
    "middle_contribution_layer": "sum of contribution_layer over middle keys",
    "middle_count": "number of middle keys of the query",
}
SEQUENCE_VARIABLES: dict[str, str] = {
    "token_id": "token id at each position (-1 beyond length)",
    "length": "number of real tokens in the sequence",
    "truncated": "1 when the text was cut at max_length",
    "finite": "1 when every activation of the sequence was finite (0: excluded from statistics)",
    "text_index": "index of the text in the data spec",
    "special": "1 where the token is a special token of the tokenizer (BOS, EOS, CLS, ...)",
}

DIMS: dict[str, tuple[str, ...]] = {
    **{n: PAIR for n in PAIR_VARIABLES},
    **{n: PER_KEY for n in PER_KEY_VARIABLES},
    **{n: PER_QUERY for n in PER_QUERY_VARIABLES},
    **{n: PER_QUERY for n in LEARNED_SINK_VARIABLES},
    **{n: PER_LAYER_QUERY for n in PER_LAYER_QUERY_VARIABLES},
    **{n: TAIL for n in TAIL_VARIABLES},
    **{n: TAIL for n in DERIVED_TAIL_VARIABLES},
    **{n: PER_QUERY for n in MIDDLE_VARIABLES},
    "token_id": (SEQUENCE, POSITION),
    "token": (SEQUENCE, POSITION),
    "special": (SEQUENCE, POSITION),
    "length": (SEQUENCE,),
    "truncated": (SEQUENCE,),
    "finite": (SEQUENCE,),
    "text_index": (SEQUENCE,),
}

DESCRIPTIONS: dict[str, str] = {
    **PAIR_VARIABLES, **DERIVED_PAIR_VARIABLES, **PER_KEY_VARIABLES, **PER_QUERY_VARIABLES,
    **LEARNED_SINK_VARIABLES,
    **PER_LAYER_QUERY_VARIABLES, **TAIL_VARIABLES, **DERIVED_TAIL_VARIABLES, **MIDDLE_VARIABLES,
    **SEQUENCE_VARIABLES,
    "token": "token string at each position (absent when stored with --no-text)",
}

MODES = LAYOUTS

# variables that do not vary by head: packed stores keep them once, on these dims (the
# attention mask is shared by a layer's heads; sliding windows make it differ by layer)
HEAD_FREE: dict[str, tuple[str, ...]] = {"middle_count": PER_LAYER_QUERY}


def dims_for(name: str, mode: str, precision: str = FLOAT32) -> tuple[str, ...]:
    """Dims of variable ``name`` in a shard of layout ``mode`` and ``precision``: compact pair
    variables are on ``sink`` instead of ``key``; packed stores keep :data:`HEAD_FREE`
    variables without ``head``."""
    if precision == PACKED and name in HEAD_FREE:
        return HEAD_FREE[name]
    dims = DIMS[name]
    return SINK_PAIR if mode == COMPACT and dims == PAIR else dims


def cells(name: str, mode: str, sizes: dict[str, int], precision: str = FLOAT32) -> int:
    """Cells one sequence holds of variable ``name`` (``sizes``: each dim's size but
    ``sequence``'s)."""
    n = 1
    for dim in dims_for(name, mode, precision):
        n *= 1 if dim == SEQUENCE else int(sizes[dim])
    return n


def variables_for(mode: str, learned_sinks: bool = False) -> list[str]:
    """Names of the float variables a shard of this layout stores (derived ones excluded);
    ``learned_sinks``: the model has learned sink logits (``learned_sink_alpha`` stored)."""
    base = (list(PAIR_VARIABLES) + list(PER_KEY_VARIABLES) + list(PER_QUERY_VARIABLES)
            + list(PER_LAYER_QUERY_VARIABLES))
    if learned_sinks:
        base += list(LEARNED_SINK_VARIABLES)
    if mode == "compact":
        base += list(TAIL_VARIABLES) + list(MIDDLE_VARIABLES)
    return base
