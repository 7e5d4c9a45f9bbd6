"""TransformerLens: a TransformerBridge as booted, ``run_with_cache`` with a names filter.

TransformerLens 4's documentation loads Hugging Face models with
``TransformerBridge.boot_transformers``, which "returns a bridge whose default numerics match
HuggingFace — raw weights, no folding, no centering" (``enable_compatibility_mode()`` would fold
the layer norms and centre the writing weights, moving b_V and recentring W_O; Compatibility
Mode, https://github.com/TransformerLensOrg/TransformerLens/blob/main/docs/source/content/compatibility_mode.md),
so the bridge is used as booted: without weight processing. Its hook system page teaches
``run_with_cache`` with ``names_filter=`` "to cache only a subset (saves memory)" (The Hook
System, https://github.com/TransformerLensOrg/TransformerLens/blob/main/docs/source/content/hook_system.md):
here each layer's attention pattern (``hook_pattern``, batch x head x query x key), values
(``hook_v``, batch x pos x kv head x d_head) and heads' outputs before W_O (``hook_z``, batch x
pos x head x d_head), with the bridge's ``W_O`` (layer x head x d_head x d_model).
``stop_at_layer`` = the number of layers ends the forward after the last block (no
unembedding: attngeom computes no logits).

Tokens: ``to_tokens(texts, prepend_bos=False)``, the model's own tokenization. The bridge's
default prepends a BOS token that SmolLM2's tokenizer does not add, and every number moves.

    python peer_transformerlens.py --model DIR --data texts.jsonl --limit 16 --max-length 512
"""

from __future__ import annotations

import torch

import _peer


def main() -> None:
    args = _peer.parse(__doc__.splitlines()[0])
    from transformer_lens.model_bridge import TransformerBridge

    t0 = _peer.clock()
    bridge = TransformerBridge.boot_transformers(args.model, device="cpu", dtype=torch.float32)
    load_s = _peer.clock() - t0
    n_layers = bridge.cfg.n_layers
    wanted = ("attn.hook_pattern", "attn.hook_v", "attn.hook_z")
    results = _peer.Results(args.results)

    t0 = _peer.clock()
    with torch.inference_mode():
        for b, batch in enumerate(_peer.chunks(_peer.texts(args.data, args.limit),
                                               args.batch_size)):
            rows = [bridge.to_tokens(text, prepend_bos=False)[0, :args.max_length]
                    for text in batch]
            T = max(len(r) for r in rows)
            tokens = torch.full((len(rows), T), bridge.tokenizer.pad_token_id or 0)
            mask = torch.zeros((len(rows), T), dtype=torch.long)
            for i, r in enumerate(rows):
                tokens[i, :len(r)], mask[i, :len(r)] = r, 1
            _, cache = bridge.run_with_cache(
                tokens, names_filter=lambda name: name.endswith(wanted),
                stop_at_layer=n_layers, attention_mask=mask)
            for layer in range(n_layers):
                results.add(b, layer, _peer.geometry(
                    cache["pattern", layer], cache["v", layer], cache["z", layer],
                    bridge.W_O[layer]))
            del cache
            results.tokens(tokens, mask)
    measure_s = _peer.clock() - t0
    if args.save:
        results.save(args.save)
    import transformer_lens
    _peer.report("transformerlens", args, load_s, measure_s, results,
                 version=getattr(transformer_lens, "__version__", None))


if __name__ == "__main__":
    main()
