"""inseq: the attention weights of every layer and head, for what inseq computes of the rest.

inseq's getting-started page loads a model with an attribution method attached
(``inseq.load_model(model, method)``) and attributes a given output with
``model.attribute(input_texts, generated_texts=...)``: "Specifying one string in
``generated_texts`` for every sentence in ``input_texts`` allows attributing custom generation
outputs" (Getting started with Inseq,
https://inseq.readthedocs.io/en/latest/examples/quickstart.html). The ``attention`` method
"retrieves the attention weights from the model" (Feature attribution methods,
https://inseq.readthedocs.io/en/latest/main_classes/feature_attribution.html): for a
decoder-only model, ``target_attributions`` of shape (key, generated step, layer, head).
With the first token as the input text and the text itself as the generated one, the step that
generates token t + 1 reads the attention of query t: the steps are the queries 0 .. T-2 of
the text, and each step's attributions are that query's row of alpha; the last query, which
would generate a token after the text, is not an attribution step. inseq has no projected
value norms, cosines or contribution weights: only alpha is compared and measured. inseq runs
decoder-only models one text at a time ("Batched constrained decoding is currently not
supported for decoder-only models. Using batch size of 1."), whatever ``--batch-size`` says.

inseq reads texts, not token ids: each text is cut to ``--max-length`` tokens and decoded, and
inseq encodes it again; the tokens it attributed are saved so that ``check.py`` compares them.
The model is loaded with eager attention (the one that returns weights) in float32.

    python peer_inseq.py --model DIR --data texts.jsonl --limit 16 --max-length 512
"""

from __future__ import annotations

from importlib import metadata

import torch

import _peer


def main() -> None:
    args = _peer.parse(__doc__.splitlines()[0])
    import inseq

    t0 = _peer.clock()
    model = inseq.load_model(args.model, "attention", model_kwargs={
        "attn_implementation": "eager", "dtype": torch.float32})
    load_s = _peer.clock() - t0
    tokenizer = model.tokenizer
    results = _peer.Results(args.results)
    kept, held = [], 0

    t0 = _peer.clock()
    sequence = 0
    for batch in _peer.chunks(_peer.texts(args.data, args.limit), args.batch_size):
        ids = [tokenizer(t)["input_ids"][:args.max_length] for t in batch]   # the first T
        targets = [tokenizer.decode(row) for row in ids]
        prefixes = [tokenizer.decode(row[:1]) for row in ids]
        out = model.attribute(prefixes, targets, show_progress=False,
                              batch_size=len(batch), skip_special_tokens=False)
        for attr in out.sequence_attributions:
            a = attr.target_attributions                       # (key, query < T-1, layer, head)
            held += a.numel() * a.element_size()
            tokens = torch.tensor([[t.id for t in attr.target]])
            if args.save:
                T = a.shape[0]
                alpha = torch.full((T, T) + a.shape[2:], float("nan"))
                alpha[:-1] = a.transpose(0, 1)                 # (query, key, layer, head)
                alpha = alpha.permute(2, 3, 0, 1)[:, None]     # (layer, 1, head, q, k)
                for layer in range(alpha.shape[0]):
                    results.add(sequence, layer, {"alpha": alpha[layer]})
            results.tokens(tokens, torch.ones_like(tokens))
            sequence += 1
        if args.results == "keep":
            kept.append(out)
        del out
    measure_s = _peer.clock() - t0
    if args.save:
        results.save(args.save)
    results.nbytes = held if args.results == "keep" else 0
    _peer.report("inseq", args, load_s, measure_s, results, version=metadata.version("inseq"),
                 computes="alpha only")


if __name__ == "__main__":
    main()
