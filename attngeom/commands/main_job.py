"""``attngeom run``: the main job, extract -> faithfulness -> analyze -> report, in one command.

A thin layer over :mod:`attngeom.pipeline` (callable from Python the same way). The defaults
finish in a few minutes on two shared CPU cores (one thread): SmolLM2-135M over the first 48
chunks of the built-in corpus at 128 tokens (compact store), faithfulness on 8 of them for the
paper's four metrics (signed and magnitude ranking, removal fractions 0.1, 0.25 and 0.5), the
four analyses, and the PDF. Rerunning skips the steps whose outputs are current.
"""

from __future__ import annotations

import argparse
from functools import partial

from attngeom.common.options.commands import RUN_FAITH_BLOCK, RUN_STAGES, RunOptions
from attngeom.common.options.stages import (AnalysisOptions, ExtractConfig, FaithConfig,
                                            add_arguments, from_args)


def add_parser(p: argparse.ArgumentParser) -> None:
    add_arguments(p, RunOptions)
    for stage, only, defaults in RUN_STAGES:
        add_arguments(p, stage, only, defaults)


def job_options(args: argparse.Namespace):
    """The job from the command line, every option checked (before torch is imported)."""
    from attngeom.pipeline import Job

    own = from_args(args, RunOptions)
    faith = (from_args(args, FaithConfig, limit=own.faith_limit, block_size=RUN_FAITH_BLOCK)
             if own.faith_limit else None)
    job = Job(own, from_args(args, ExtractConfig), faith, from_args(args, AnalysisOptions))
    job.check()
    return job


def run(args: argparse.Namespace) -> int:
    from attngeom.pipeline import run_job

    run_job(job_options(args), log=partial(print, flush=True))
    return 0
