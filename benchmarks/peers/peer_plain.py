"""The baseline a researcher writes first: Hugging Face transformers and PyTorch hooks.

The model is loaded with eager attention, the one implementation that returns the attention
weights; ``output_attentions=True`` returns them for every layer ("attentions: tuple of
torch.FloatTensor (one for each layer) of shape (batch_size, num_heads, sequence_length,
sequence_length). Attentions weights after the attention softmax", transformers' model outputs,
https://huggingface.co/docs/transformers/main_classes/output). The values and the heads'
outputs before the output projection come from forward hooks on ``v_proj`` (its output) and
``o_proj`` (a forward pre-hook: its input), as PyTorch's hooks documentation teaches
(https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_forward_hook).
The decoder stack is run without the language-model head (``model.model``): no logits are
needed, and attngeom computes none.

``--layer-by-layer``: instead of returning every layer's weights at the end, a forward hook on
each attention module computes that layer's measurements as soon as the layer has run (its
output holds the weights under eager attention, transformers' attention interface,
https://huggingface.co/docs/transformers/attention_interface), so only one layer's T x T
weights are alive at a time: the careful version of the same script.

    python peer_plain.py --model DIR --data texts.jsonl --limit 16 --max-length 512
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import _peer


def main() -> None:
    args = _peer.parse(__doc__.splitlines()[0], lambda p: p.add_argument(
        "--layer-by-layer", action="store_true",
        help="measure each layer in a hook as it runs (no output_attentions)"))
    t0 = _peer.clock()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    load_s = _peer.clock() - t0
    attn = [layer.self_attn for layer in model.model.layers]
    H, dh = model.config.num_attention_heads, model.config.head_dim
    G = model.config.num_key_value_heads
    w_o = [a.o_proj.weight.T.reshape(H, dh, -1) for a in attn]       # (H, d_head, d)

    captured: dict[int, dict[str, torch.Tensor]] = {}
    results = _peer.Results(args.results)
    state = {"batch": 0}

    def values(i):
        def hook(module, inputs, output):          # v_proj: (B, T, G * d_head)
            captured.setdefault(i, {})["v"] = output.unflatten(-1, (G, dh))
        return hook

    def head_outputs(i):
        def hook(module, inputs):                  # o_proj's input: (B, T, H * d_head)
            captured[i]["z"] = inputs[0].unflatten(-1, (H, dh))
        return hook

    def layer_done(i):
        def hook(module, inputs, output):          # (attn_output, attn_weights) under eager
            c = captured.pop(i)
            results.add(state["batch"], i, _peer.geometry(output[1], c["v"], c["z"], w_o[i]))
        return hook

    for i, a in enumerate(attn):
        a.v_proj.register_forward_hook(values(i))
        a.o_proj.register_forward_pre_hook(head_outputs(i))
        if args.layer_by_layer:
            a.register_forward_hook(layer_done(i))

    t0 = _peer.clock()
    with torch.inference_mode():
        for b, batch in enumerate(_peer.chunks(_peer.texts(args.data, args.limit),
                                               args.batch_size)):
            state["batch"] = b
            enc = _peer.tokenize(tokenizer, batch, args.max_length)
            out = model.model(**enc, output_attentions=not args.layer_by_layer,
                              use_cache=False)
            if not args.layer_by_layer:
                for i, alpha in enumerate(out.attentions):
                    c = captured.pop(i)
                    results.add(b, i, _peer.geometry(alpha, c["v"], c["z"], w_o[i]))
            del out
            results.tokens(enc["input_ids"], enc["attention_mask"])
    measure_s = _peer.clock() - t0
    if args.save:
        results.save(args.save)
    _peer.report("plain-layer" if args.layer_by_layer else "plain", args, load_s, measure_s,
                 results)


if __name__ == "__main__":
    main()
