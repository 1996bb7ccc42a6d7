"""A sweep's files (``soapbox sweep`` / ``soapbox plan``): its rows as CSV, JSON or Parquet,
its HTML report (Pareto fronts), and the check that an output can be written, made before a
sweep runs so that a typo loses no work. The rows: :mod:`engine.studies.sweep`."""

from __future__ import annotations

import os
from typing import Any, Sequence

from .sweep import COLUMNS, gpu_type, pareto, training_front

__all__ = ["write_rows", "write_report", "check_output"]


def write_rows(rows: list[dict[str, Any]], path: str) -> None:
    """CSV, JSON or Parquet by the file's extension (Parquet needs pyarrow)."""
    import csv
    import io
    import json

    from ..formats.writing import atomic_writer

    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        text = json.dumps({"format": "soapbox.sweep/1", "columns": list(COLUMNS), "rows": rows}, indent=1)
    elif ext == ".csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        text = buf.getvalue()
    elif ext == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError("writing Parquet needs pyarrow (pip install pyarrow); or write .csv / .json") from None
        with atomic_writer(path, make_parents=True, binary=True) as f:
            pq.write_table(pa.Table.from_pylist(rows), f)
        return
    else:
        raise ValueError(f"{path}: write .csv, .json or .parquet")
    with atomic_writer(path, make_parents=True) as f:
        f.write(text)


def check_output(path: str, extensions: Sequence[str], flag: str) -> None:
    """A ``ValueError`` naming ``flag`` when ``path`` cannot be written as one of
    ``extensions`` (a name ending otherwise, a folder, a folder on the way that is a file or
    cannot be written, Parquet without pyarrow): checked before a sweep, so that a typo loses
    no work."""
    from pathlib import Path

    ext = os.path.splitext(path)[1].lower()
    if ext not in extensions:
        raise ValueError(f"{flag} {path[:200]!r}: write {', '.join(extensions[:-1])} or {extensions[-1]}"
                         if len(extensions) > 1 else f"{flag} {path[:200]!r}: write {extensions[0]}")
    if ext == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ValueError(f"{flag}: writing Parquet needs pyarrow (pip install pyarrow); or write .csv / .json") \
                from None
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path[:200]!r} is a folder; give a file name")
    folder = next((a for a in p.parents if a.exists()), Path("."))
    if not folder.is_dir():
        raise ValueError(f"{flag} {path[:200]!r}: {str(folder)[:200]!r} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path[:200]!r}: cannot write in {str(folder)[:200]!r}")


def write_report(rows: list[dict[str, Any]], path: str, title: str, tokens: float | None = None,
                 unit: str = "tokens") -> None:
    """An HTML page: iteration time against GPUs per layout (feasible points; the Pareto front
    over time, GPUs and memory drawn as a line), peak memory against time, tokens per second
    per GPU against GPUs by GPU type, and (``tokens``: a training run of that many tokens) the
    days it takes against the GPU-hours it costs, with that trade-off's Pareto front. ``unit``:
    what the rows' throughput counts, ``tokens`` or ``samples`` (a model that is not a language
    model: its rows count samples, and so do the page's labels and ``tokens``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from ..cluster.network import network_label
    from ..formats.writing import atomic_writer

    ok = [r for r in rows if r["feasible"]]
    front = pareto(rows)
    varied = [k for k in ("nics", "nic_gbps", "pod_gpus", "oversub") if len({r.get(k) for r in rows}) > 1]

    def net(r):  # (the network, where the sweep varies it: a preset's name holds it, a cluster file's may not)
        text = network_label({k: r.get(k) for k in varied})
        return f" ({text})" if text else ""

    def label(r):
        ep, etp = r.get("ep") or 1, r.get("etp") or 1
        moe = f" ep {ep} etp {etp}" if ep * etp > 1 else ""
        return (f"{r['cluster']}: tp {r['tp']} pp {r['pp']} cp {r['cp']} dp {r['dp']}{moe} mb {r['mb']} "
                f"{r['recompute']} z{r['zero']}")

    fig = make_subplots(rows=2, cols=2, subplot_titles=[
        "iteration time (s) by GPUs", "peak memory (GB) by time (s)", f"{unit}/s per GPU by GPUs",
        f"days against GPU-hours for {tokens:.3g} {unit}" if tokens else f"days against GPU-hours (give {unit})"])
    fig.add_trace(go.Scatter(x=[r["gpus"] for r in ok], y=[r["iteration_time_s"] for r in ok], mode="markers",
                             text=[label(r) for r in ok], name="feasible layouts"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[r["gpus"] for r in front], y=[r["iteration_time_s"] for r in front],
                             mode="lines+markers", text=[label(r) for r in front], name="Pareto front"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[r["iteration_time_s"] for r in ok], y=[r["peak_memory_bytes"] / 1e9 for r in ok],
                             mode="markers", text=[label(r) for r in ok], name="memory", showlegend=False), row=1, col=2)
    for kind in sorted({gpu_type(r["cluster"]) + net(r) for r in ok}):
        mine = [r for r in ok if gpu_type(r["cluster"]) + net(r) == kind and r.get("throughput_per_s")]
        fig.add_trace(go.Scatter(x=[r["gpus"] for r in mine], y=[r["throughput_per_s"] / r["gpus"] for r in mine],
                                 mode="markers", text=[label(r) for r in mine], name=kind), row=2, col=1)
    if tokens:
        tf = training_front(rows, tokens)
        allr = [{**r, "days": tokens / r["throughput_per_s"] / 86400.0,
                 "gpu_hours": tokens / r["throughput_per_s"] / 3600.0 * r["gpus"]} for r in ok if r.get("throughput_per_s")]
        fig.add_trace(go.Scatter(x=[r["gpu_hours"] for r in allr], y=[r["days"] for r in allr], mode="markers",
                                 text=[label(r) for r in allr], name="runs", showlegend=False,
                                 marker=dict(color="lightgray")), row=2, col=2)
        fig.add_trace(go.Scatter(x=[r["gpu_hours"] for r in tf], y=[r["days"] for r in tf], mode="lines+markers",
                                 text=[label(r) for r in tf], name="days / GPU-hours front"), row=2, col=2)
        fig.update_xaxes(type="log", title_text="GPU-hours", row=2, col=2)
        fig.update_yaxes(type="log", title_text="days", row=2, col=2)
    fig.update_xaxes(type="log", title_text="GPUs", row=1, col=1)
    fig.update_yaxes(type="log", title_text="s", row=1, col=1)
    fig.update_xaxes(type="log", title_text="GPUs", row=2, col=1)
    fig.update_yaxes(title_text=f"{unit}/s per GPU", row=2, col=1)
    fig.update_layout(title=f"{title}: {len(ok)} of {len(rows)} layouts fit; {len(front)} on the Pareto front",
                      height=900)
    html = fig.to_html(include_plotlyjs="cdn", full_html=True)
    with atomic_writer(path, make_parents=True) as f:
        f.write(html)
