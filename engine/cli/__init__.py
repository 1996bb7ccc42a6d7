"""The ``soapbox`` command.

Sub-commands (``soapbox COMMAND --help`` for each):

* ``models`` / ``clusters``: the sample models and cluster presets (``--json``);
  ``models --write FOLDER`` writes the sample models' files from their builders.
* ``validate FILE``: check a model, cluster or strategy file; exit 0 when valid, 1 with
  every problem listed otherwise.
* ``model gpt``: write a GPT-style model file from its shape.
* ``import --hf config.json``: write a model file from a Hugging Face config (GPT-2, LLaMA,
  Mistral, Qwen2, Phi-3, Gemma, Falcon and the MoE families Mixtral, Qwen3-MoE, DeepSeek-V3, GPT-OSS).
* ``cluster NAME -o FILE``: write a preset as an editable cluster file.
* ``schema model|cluster|strategy``: print a format's JSON Schema.
* ``baseline``: build a baseline strategy for a model on a cluster and write it.
* ``simulate``: simulate one iteration of a strategy (file or baseline kind); ``--json``,
  ``--trace`` for a Chrome trace.
* ``experts``: the expert view of a mixture-of-experts strategy (experts and routed tokens
  per expert-parallel rank, the busiest rank's gate).
* ``search``: search for a faster strategy (MCMC with delta simulation); ``-o best.json``.
* ``init-sweep``: parallel random initialisation against N runs and one run, at equal compute
  (a small MLP trained with PyTorch on CPU; :mod:`engine.experiments.init_sweep`).

Exit status: 0 done; 1 an invalid file under ``validate``; 2 an error a user can fix
(printed as one line ``soapbox: error: ...``, no traceback: a bad argument, an unreadable
or invalid input, an output that cannot be written); 3 ``simulate`` of a strategy that does
not fit in memory (the report is printed and says which devices are over), ``search``
that found no strategy that fits, or ``whatif`` whose re-plan found no plan that fits; 130
interrupted (Ctrl-C), 143 terminated (SIGTERM). An interrupted write leaves the file it would
replace as it was and no temporary file. An
interrupted (or terminated) ``search -o FILE`` writes the best strategy it had found to FILE
first, and says so.

Names: ``--model``, ``--cluster``, ``--strategy``, ``--profile`` and ``validate FILE`` may
be paths, since a user typed them; the model and cluster a strategy file names resolve only
to samples and presets.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, Callable, Mapping, Sequence

from ..errors import ROOT_CAUSE_PATHS, SUMMARY_PROBLEMS, SoapboxError, ValidationError, printable, problems_summary
from .commands import (cmd_baseline, cmd_export, cmd_import, cmd_profile, cmd_cluster, cmd_clusters, cmd_experts,
    cmd_model, cmd_models, cmd_schema, cmd_simulate, cmd_whatif, cmd_validate)
from .common import (EPILOG, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, add_strategy_options, int_in,
                     strategy_options)
from .init_sweep import add_init_sweep_parser, cmd_init_sweep
from .plan import add_plan_parser, cmd_plan
from .parsers import (add_baseline, add_cluster, add_clusters, add_experts, add_export, add_import, add_model,
                      add_models, add_profile, add_schema, add_search, add_simulate, add_sweep, add_validate,
                      add_whatif)
from .search import cmd_search, compare_searches
from .sweep import cmd_sweep

__all__ = ["main", "int_in", "build_parser", "add_strategy_options", "strategy_options", "compare_searches"]


#: A command added by a layer above the engine (the app adds ``serve``): help text, a function
#: that adds its arguments, and the function that runs it.
ExtraCommand = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def build_parser(extra: Mapping[str, ExtraCommand] | None = None) -> argparse.ArgumentParser:
    """The ``soapbox`` command's parser: ``extra``'s commands first (the app's ``serve``), then
    the engine's, each made by its function in :mod:`engine.cli.parsers`."""
    parser = argparse.ArgumentParser(
        prog="soapbox",
        description="Explore, simulate and search parallelization strategies for DNN training.",
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_args, _) in (extra or {}).items():
        add_args(sub.add_parser(name, help=help_text))

    add_models(sub)
    add_clusters(sub)
    add_cluster(sub)
    add_schema(sub)
    add_validate(sub)
    add_model(sub)
    add_import(sub)
    add_profile(sub)
    add_export(sub)
    add_sweep(sub)
    add_plan_parser(sub)
    add_init_sweep_parser(sub)
    add_whatif(sub)
    add_simulate(sub)
    add_search(sub)
    add_baseline(sub)
    add_experts(sub)
    return parser


COMMANDS = {
    "models": cmd_models,
    "clusters": cmd_clusters,
    "cluster": cmd_cluster,
    "schema": cmd_schema,
    "validate": cmd_validate,
    "simulate": cmd_simulate,
    "search": cmd_search,
    "model": cmd_model,
    "baseline": cmd_baseline,
    "import": cmd_import,
    "profile": cmd_profile,
    "export": cmd_export,
    "sweep": cmd_sweep,
    "plan": cmd_plan,
    "whatif": cmd_whatif,
    "experts": cmd_experts,
    "init-sweep": cmd_init_sweep,
}


_Terminated = Terminated  # (its former name)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None, extra: Mapping[str, ExtraCommand] | None = None) -> int:
    """Run the ``soapbox`` command; ``extra`` adds commands from outside the engine.

    Returns the exit status (see the module docstring): 0, 1, 2, 3, 130 or 143.
    """
    parser = build_parser(extra)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    run = {**COMMANDS, **{k: v[2] for k, v in (extra or {}).items()}}
    # The engine's own commands turn SIGTERM into an exception (temporary files are removed);
    # a command added from outside (the app's server) keeps its own signal handling.
    own = args.command in COMMANDS and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if own else None
    try:
        return run[args.command](args)
    except (SoapboxError, ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):  # output piped into a command that stopped reading (`| head`)
            sys.stderr.close()
            return 0
        if isinstance(exc, ValidationError):  # the root cause, a few problems and a count
            text = problems_summary(exc)
            if sum(p.path not in ROOT_CAUSE_PATHS for p in exc.problems) > SUMMARY_PROBLEMS:
                text += "\n  (`soapbox validate FILE` lists every problem)"
        else:
            text = str(exc) if isinstance(exc, (SoapboxError, ValueError)) else \
                f"{exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}"
        lines = "\n".join(printable(line, 100_000) for line in text.split("\n"))
        print(f"soapbox: error: {lines}", file=sys.stderr)
        return EXIT_ERROR
    except RecursionError:  # (no input should reach one; a last line of defence)
        print("soapbox: error: an input is nested too deeply", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("soapbox: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("soapbox: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        if own:
            signal.signal(signal.SIGTERM, previous)


