"""What the commands share: exit statuses, argument types, and the options that shape a
baseline strategy. See :mod:`engine.cli`."""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

from ..cluster import MAX_DEVICES
from ..errors import ValidationError, printable
from ..ops import MAX_DIM

__all__ = ["EXIT_INVALID_FILE", "EXIT_ERROR", "EXIT_DOES_NOT_FIT", "EXIT_INTERRUPTED", "EXIT_TERMINATED",
           "Terminated", "EPILOG", "int_in", "number_in", "positive_int", "device_count", "name_arg",
           "add_strategy_options", "strategy_options",
           "add_batch_options", "model_and_cluster", "add_routing_options", "routing_loads", "with_routing",
           "baseline_strategy"]


EXIT_INVALID_FILE = 1
EXIT_ERROR = 2
EXIT_DOES_NOT_FIT = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's status for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (:func:`engine.cli.main` installs the handler) so that
    ``finally`` blocks and temporary-file clean-ups run as for Ctrl-C."""
EPILOG = ("exit status: 0 done; 1 invalid file (validate); 2 error (one line 'soapbox: error: ...'); "
          "3 the strategy does not fit in memory (simulate) or no strategy found fits (search); "
          "130 interrupted; 143 terminated")


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``lo`` to ``hi``."""
    def parse(text: str) -> int:
        try:
            v = int(text) if len(text) <= 30 else None
        except ValueError:
            v = None
        if v is None:
            raise argparse.ArgumentTypeError(f"{printable(text, 40)!r} is not a whole number (from {lo:,} to {hi:,})")
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} must be at least {lo}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"{v} must be at most {hi:,}")
        return v
    return parse


def number_in(lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a finite number from ``lo`` to ``hi`` (both included).

    >>> number_in(0, 1)("0.5"), number_in(0, 1e12)("1e3")
    (0.5, 1000.0)
    """
    def parse(text: str) -> float:
        try:
            v = float(text) if len(text) <= 60 else math.nan
        except ValueError:
            v = math.nan
        if not lo <= v <= hi:  # (NaN is in no range)
            raise argparse.ArgumentTypeError(f"{printable(text, 40)!r} is not a number from {lo:g} to {hi:g}")
        return v
    return parse


positive_int = int_in(1, MAX_DIM)
device_count = int_in(1, MAX_DEVICES)


def name_arg(text: str) -> str:
    """An argparse type: a model name as the model schema accepts it (1 to 256 characters)."""
    from ..formats import MAX_NAME_CHARS

    if not 0 < len(text) <= MAX_NAME_CHARS:
        raise argparse.ArgumentTypeError(f"a name of 1 to {MAX_NAME_CHARS} characters, got {len(text):,}")
    return text


def add_strategy_options(p: argparse.ArgumentParser) -> None:
    """Options that shape a baseline strategy; the same on ``baseline``, ``simulate`` and
    ``search`` so ``--strategy megatron --tp 8 ...`` names a strategy anywhere. One flag per
    :class:`engine.layout.record.Layout` field that has one, made from the field's
    :class:`engine.layout.record.Option` (its help, the builders that take it, its range);
    ``fp8`` is ``--precision fp8``, and ``--no-overlap`` turns every overlap off at once."""
    from ..layout.record import OPTION_NAMES, option_of, value_kind

    g = p.add_argument_group("baseline options (see `soapbox baseline --help`)")
    for name in OPTION_NAMES:
        o = option_of(name)
        if not o.flag:
            continue
        text = f"{o.help} ({', '.join(o.kinds)})"
        if name == "fp8":
            g.add_argument("--precision", choices=("fp8",), dest="fp8_precision", help=text)
            continue
        flag, kind, default = "--" + name.replace("_", "-"), value_kind(name), _default(name)
        if kind == "bool":
            action = argparse.BooleanOptionalAction if o.negatable or default is True else "store_true"
            g.add_argument(flag, action=action, default=None, help=text)
        elif kind == "text":
            g.add_argument(flag, choices=o.choices, help=text)
        elif kind == "names":
            g.add_argument(flag, type=_names(name), metavar=o.metavar, help=text)
        elif kind == "ints":
            g.add_argument(flag, type=_counts, metavar=o.metavar, help=text)
        else:
            g.add_argument(flag, type=int_in(o.fewest, o.most), metavar=o.metavar, help=text)
    g.add_argument("--no-overlap", action="store_true",
                   help="turn the communication overlaps off (tp, gradient reduce, parameter gather, MoE "
                        "all-to-all; pipeline sends always run beside compute)")


def _default(name: str) -> Any:
    from ..layout.record import Layout

    return getattr(Layout(), name)


def add_batch_options(p: argparse.ArgumentParser, per_gpu: bool = True) -> None:
    """``--batch`` / ``--batch-per-gpu`` (``per_gpu``: where one cluster sets the GPUs) for a
    sample model, and its sequence length and precision."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--batch", type=positive_int, help="a sample model's global batch, in samples")
    if per_gpu:
        g.add_argument("--batch-per-gpu", type=positive_int, metavar="N",
                       help="a sample model's batch per GPU: global batch = N x the cluster's GPUs (FlexFlow's weak "
                            "scaling: 64)")
    p.add_argument("--seq-len", type=positive_int, metavar="TOKENS",
                   help="a sample language model's sequence length, when not its default")
    p.add_argument("--model-precision", choices=["fp32", "tf32", "fp16", "bf16"],
                   help="a sample model's training precision, when not its default (--precision fp8 puts a "
                        "layout's GEMMs in fp8)")


def model_and_cluster(args: argparse.Namespace):
    """The model and cluster the command line names, with ``--batch``/``--batch-per-gpu``."""
    from ..formats import resolve_cluster, resolve_model

    c = resolve_cluster(args.cluster, allow_path=True)
    batch = getattr(args, "batch", None)
    per_gpu = getattr(args, "batch_per_gpu", None)
    if per_gpu is not None:
        batch = per_gpu * c.num_devices
    return resolve_model(args.model, allow_path=True, batch=batch, seq_len=getattr(args, "seq_len", None),
                         precision=getattr(args, "model_precision", None)), c


def strategy_options(args: argparse.Namespace) -> dict[str, Any]:
    """The baseline options the flags give: the :class:`engine.layout.Layout` fields that have
    a flag (named as the fields; ``--precision fp8`` sets ``fp8``), None where a flag is not
    given."""
    from ..layout.record import ON_BY_DEFAULT, OPTION_NAMES, option_of

    out = {k: getattr(args, k, None) for k in OPTION_NAMES if k != "fp8" and option_of(k).flag}
    out["fp8"] = getattr(args, "fp8_precision", None) == "fp8" or None
    if getattr(args, "no_overlap", False):
        overlaps = [k for k in OPTION_NAMES if option_of(k).panel == "overlap"]
        turned_on = [k for k in overlaps if out.get(k)]
        if turned_on:
            raise ValueError(f"--no-overlap turns every overlap off, but --{turned_on[0].replace('_', '-')} turns one "
                             "on: give one or the other")
        out.update({k: (False if k in ON_BY_DEFAULT else None) for k in overlaps})
    return out


def _counts(text: str) -> list[int]:
    """An argparse type: comma-separated positive layer counts."""
    parts = text.split(",")
    if len(parts) > MAX_DEVICES or not all(p.strip().isascii() and p.strip().isdigit() and len(p.strip()) <= 10
                                           and 0 < int(p) <= MAX_DIM for p in parts):
        raise argparse.ArgumentTypeError(f"{printable(text, 40)!r} is not a list of positive layer counts "
                                         "(e.g. 7,8,8,7)")
    return [int(p) for p in parts]




# --------------------------------------------------------------------------- mixture of experts


def add_routing_options(p: argparse.ArgumentParser) -> None:
    """``--routing-skew`` / ``--routing-histogram``: the routing-imbalance what-if of a
    mixture-of-experts model (:attr:`engine.strategy.Strategy.expert_loads`)."""
    from ..moe import MAX_HISTOGRAM_EXPERTS, MAX_SKEW

    g = p.add_argument_group("routing-imbalance what-if (mixture-of-experts models; default balanced, as "
                             "published MoE runs are measured)").add_mutually_exclusive_group()
    g.add_argument("--routing-skew", type=number_in(0.0, MAX_SKEW), metavar="S",
                   help=f"tokens spread over the experts by Zipf's law with exponent S (0 balanced, up to "
                        f"{MAX_SKEW:g}; at 1 the first of 8 experts gets 37%%): every expert-parallel rank waits "
                        "for the busiest one")
    g.add_argument("--routing-histogram", metavar="FILE",
                   help=f"measured token counts per expert (any scale): a JSON list, one number a line, or "
                        f"numbers separated by commas; as many as the model has experts (at most "
                        f"{MAX_HISTOGRAM_EXPERTS:,})")


def routing_loads(args: argparse.Namespace, graph) -> tuple[float, ...] | None:
    """The expert shares ``--routing-skew`` or ``--routing-histogram`` give for ``graph``
    (:func:`engine.moe.expert_loads`), or None when neither is given.

    Raises
    ------
    ValueError
        For a dense model, a model whose MoE layers differ in expert count, or a histogram
        file that cannot be read or parsed (naming the file and the line).
    """
    from ..formats.jsonio import read_bytes
    from ..moe import MAX_HISTOGRAM_BYTES, expert_counts, expert_loads, parse_histogram

    skew, path = getattr(args, "routing_skew", None), getattr(args, "routing_histogram", None)
    if skew is None and path is None:
        return None
    flag = "--routing-skew" if path is None else "--routing-histogram"
    counts = sorted(expert_counts(graph))
    if not counts:
        raise ValueError(f"{flag}: the routing-imbalance what-if needs a mixture-of-experts model; "
                         f"{printable(graph.name, 80)!r} has no experts (samples with experts: mixtral-8x7b, "
                         "deepseek-v3, qwen3-30b-a3b, qwen3-235b-a22b, gpt-oss-120b)")
    if len(counts) > 1:
        raise ValueError(f"{flag}: {printable(graph.name, 80)!r} has MoE layers of {' and '.join(map(str, counts))} "
                         "experts; the what-if takes one expert count")
    if path is None:
        return tuple(float(x) for x in expert_loads(counts[0], skew=skew))
    source = f"--routing-histogram {printable(str(path), 200)}"
    try:
        raw = read_bytes(path, source, MAX_HISTOGRAM_BYTES, "a routing histogram")
    except ValidationError as e:  # (one line: not found, a folder, too large)
        raise ValueError(f"{source}: {'; '.join(p.message for p in e.problems)}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{source}: not UTF-8 text (byte {e.start})") from None
    hist = parse_histogram(text, source)
    try:
        return tuple(float(x) for x in expert_loads(counts[0], histogram=hist))
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def with_routing(strategy, args: argparse.Namespace, graph):
    """``strategy`` with the routing what-if of the flags (:func:`routing_loads`); as it was
    without them."""
    from dataclasses import replace

    loads = routing_loads(args, graph)
    return strategy if loads is None else replace(strategy, expert_loads=loads)


def baseline_strategy(kind: str, graph, cluster, options: dict[str, Any], make: Callable[..., Any] | None = None):
    """Baseline ``kind`` with the flags' ``options`` (:func:`strategy_options`), through
    ``make`` (default :func:`engine.search.baselines.make_baseline`): a layout kind (megatron,
    fsdp) gets the flags as one :class:`engine.layout.Layout`
    (:meth:`engine.search.baselines.Baseline.layout_of`). ``ep``/``etp`` go to the baselines
    that lay out experts (megatron, fsdp: its ZeRO shards the experts over the expert
    data-parallel ranks, torchtitan's FSDP + EP) and are refused for any other kind."""
    from ..search.baselines import BASELINES, make_baseline

    make = make or make_baseline
    opts = dict(options)
    moe = {k: v for k in ("ep", "etp") if (v := opts.pop(k, None)) is not None}
    if moe and kind in BASELINES and "ep" not in BASELINES[kind].options:
        flags = " and ".join("--" + k for k in moe)
        raise ValueError(f"{kind} does not take {flags}: expert parallelism is a megatron or fsdp layout "
                         "(--strategy megatron or fsdp)")
    if kind in BASELINES and BASELINES[kind].layout:
        return make(kind, graph, cluster, layout=BASELINES[kind].layout_of({**opts, **moe}))
    return make(kind, graph, cluster, **opts, **moe)


def _names(name: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated list of the names option ``name`` takes (argparse's
    one-line error else)."""
    from ..layout.record import parse_option

    def parse(text: str) -> tuple[str, ...]:
        try:
            return parse_option(name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse
