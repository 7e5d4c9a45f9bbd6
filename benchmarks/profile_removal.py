"""Where one removal pass spends its time: cProfile of each METRIC/MODE pass at T tokens.

    python benchmarks/profile_removal.py --length 4096 \
        --removals contribution_layer/comprehensiveness,value_weighted_normalized/comprehensiveness
    python benchmarks/profile_removal.py --length 4096 --granularity query \
        --removals attention/comprehensiveness

The setup is ``bench_length.py``'s removals child (one WikiText-2 text, the model loaded once,
every pass warmed on 32 tokens first); an eager forward of the same text is timed first as the
reference. Prints each pass's CPU and wall time and its profile's top functions by own and by
cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import bench_length as bl


def profile(run, top: int) -> tuple[float, float, str]:
    """(CPU s, wall s, the profile's text) of ``run()``."""
    pr = cProfile.Profile()
    c0, w0 = time.process_time(), time.perf_counter()
    pr.enable()
    run()
    pr.disable()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    out = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(pr, stream=out).sort_stats(key).print_stats(top)
    return cpu, wall, out.getvalue()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--removals", default="contribution_layer/comprehensiveness")
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--granularity", default="head", help="head, query or token")
    p.add_argument("--top", type=int, default=30, help="functions listed per ordering")
    a = p.parse_args(argv)

    import torch

    from attngeom.extract.faithfulness.interventions import Intervener, Removal, forward_logits
    from attngeom.extract.faithfulness.selection import Workspace
    from attngeom.extract.loading.data import pad_token_id
    from attngeom.extract.loading.models import load

    loaded = load(a.model)
    model = loaded.model
    rows = bl.tokens(loaded.tokenizer, a.length, False)
    pad = pad_token_id(loaded.tokenizer)
    inputs, warm = bl.batch(rows, pad), bl.batch([r[:32] for r in rows], pad)
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        model(**warm, use_cache=False)
        c0, w0 = time.process_time(), time.perf_counter()
        model(**inputs, use_cache=False)
        eager_cpu, eager_wall = time.process_time() - c0, time.perf_counter() - w0
        print(f"eager forward: CPU {eager_cpu:.1f} s, wall {eager_wall:.1f} s", flush=True)
        for spec in a.removals.split(","):
            metric, mode = spec.split("/")
            handler = Intervener(model, removal=Removal(metric, mode, a.fraction,
                                                         granularity=a.granularity),
                                 projections={}, workspace=Workspace())
            forward_logits(model, warm, handler)
            cpu, wall, text = profile(lambda: forward_logits(model, inputs, handler), a.top)
            print(f"\n{spec}: CPU {cpu:.1f} s ({cpu / eager_cpu:.2f}x eager), wall {wall:.1f} s "
                  f"({wall / eager_wall:.2f}x)\n{text}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
