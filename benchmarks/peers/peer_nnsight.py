"""nnsight: the Hugging Face model wrapped, the attention modules' internals saved in a trace.

nnsight's documentation wraps a Hugging Face checkpoint in ``TransformersModel`` and reads a
module's values inside ``with model.trace(...)``: "Reading ``.output`` gives you the real
tensor once the model reaches that module ... Mark anything you want after the block with
``.save()``"; "some modules (like attention) return a tuple, so you'd index ``.output[0]``"
(README, https://github.com/ndif-team/nnsight#quick-start). Per layer, in the order the forward
reaches them (the trace's rule, Trace, https://github.com/ndif-team/nnsight/blob/main/docs/usage/trace.md):
``self_attn.v_proj.output`` (the values), ``self_attn.o_proj.input`` (the heads' outputs before
W_O) and ``self_attn.output[1]`` (the attention weights, which the module returns under eager
attention). The trace runs under ``torch.no_grad()`` ("``with torch.no_grad(),
model.trace(...):`` is fine", same page; without it nnsight keeps the autograd graph), and
``tracer.stop()`` ends the forward after the last layer ("Early-exit the current forward pass":
no logits, and attngeom computes none).

    python peer_nnsight.py --model DIR --data texts.jsonl --limit 16 --max-length 512
"""

from __future__ import annotations

import torch

import _peer


def main() -> None:
    args = _peer.parse(__doc__.splitlines()[0])
    import nnsight
    from nnsight import TransformersModel

    t0 = _peer.clock()
    model = TransformersModel(args.model, task="text-generation", dispatch=True,
                              attn_implementation="eager", dtype=torch.float32)
    load_s = _peer.clock() - t0
    config = model.config
    H, dh = config.num_attention_heads, config.head_dim
    G = config.num_key_value_heads
    layers = model.model.layers
    w_o = [layer.self_attn.o_proj.weight.T.reshape(H, dh, -1) for layer in layers]
    results = _peer.Results(args.results)

    t0 = _peer.clock()
    for b, batch in enumerate(_peer.chunks(_peer.texts(args.data, args.limit),
                                           args.batch_size)):
        enc = _peer.tokenize(model.tokenizer, batch, args.max_length)
        saved = []
        with torch.no_grad(), model.trace(input_ids=enc["input_ids"],
                                          attention_mask=enc["attention_mask"]) as tracer:
            for layer in layers:
                attn = layer.self_attn
                v = attn.v_proj.output.save()
                z = attn.o_proj.input.save()
                alpha = attn.output[1].save()
                saved.append((alpha, v, z))
            tracer.stop()
        with torch.no_grad():
            for i, (alpha, v, z) in enumerate(saved):
                results.add(b, i, _peer.geometry(alpha, v.unflatten(-1, (G, dh)),
                                                 z.unflatten(-1, (H, dh)), w_o[i]))
        del saved
        results.tokens(enc["input_ids"], enc["attention_mask"])
    measure_s = _peer.clock() - t0
    if args.save:
        results.save(args.save)
    _peer.report("nnsight", args, load_s, measure_s, results, version=nnsight.__version__)


if __name__ == "__main__":
    main()
