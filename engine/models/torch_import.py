"""soapbox models from PyTorch modules (``soapbox import --torch pkg.module:factory``).

The factory returns ``(module, example_input)`` (or ``(module, (inputs, ...))``); it is called
under ``torch.device("meta")``, so the module is built without allocating or downloading
weights, and captured with ``torch.export`` (an ATen-level graph with every tensor's shape).
Each ATen call maps to a soapbox op; the GEMM-class FLOPs of the capture are counted by
``torch.utils.flop_counter`` and compared with soapbox's own count (a note says both).

Mapped ATen ops: linear, addmm / mm / matmul with a weight (linear), matmul / bmm of two
activations (batch_matmul), conv2d / convolution, max / avg / adaptive-avg pooling,
batch_norm variants, layer_norm, rms_norm, relu, gelu, silu, sigmoid, tanh, dropout, softmax,
add / sub / mul / div (equal shapes; with a scalar, constant or broadcast operand as
``elementwise``), scaled_dot_product_attention (attention), embedding, cat, views (view,
reshape, flatten, unflatten, squeeze, unsqueeze), transpose / permute, select / split / chunk
(split), slice (split, or nothing when whole), expand (broadcast: grouped-query heads),
contiguous / clone / alias / detach / to (pass through), and RMSNorm spelled out in pieces
(transformers' LlamaRMSNorm: one ``rmsnorm``). An in-place variant (``relu_``, ``add_``,
``hardtanh_``) maps as its out-of-place op. Anything else is listed, every call with its count
(a stand-in keeps the calls after an unmapped one mapped, so they are listed too);
``unknown="elementwise"`` imports shape-preserving ones as ``elementwise`` ops.

Shared parameters (GPT-2's ``lm_head.weight`` is its token table) share a ``param_group`` and
count once; a table looked up by constant ids (positions from ``arange``) stays a parameter,
its ids an input. Computations on constants alone (causal masks, rotary tables) cost nothing.
A transformers model's ``config.use_cache`` is turned off (a note says so): training keeps no
key/value cache, and ``torch.export`` cannot return one.

Running the factory runs the user's code: only the command line does it (a name the user
typed), never the app or a name read from a file.

The import runs in stages: the factory run and captured, torch's FLOPs counted, the builder
started, the graph walked (each call converted by :mod:`engine.models.torch_convert`'s
converter for its ATen name), the notes.
"""

from __future__ import annotations

import importlib
import math
import operator
import os
import re
import sys
from typing import Any, Callable

from ..errors import Problem, ValidationError
from ..graph import GraphBuilder, OpGraph
from ..graph.blocks import block_of_scopes
from ..ops import OpError
from .torch_convert import AtenCall, TorchState, Unmapped, convert, emit, lookup_by_constant_ids, node_shape
from .torch_patterns import aten_name, rms_norms, shared_parameters

__all__ = ["import_torch", "load_factory"]

_FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")

#: calls with no tensor result that soapbox skips (checks torch.export leaves in the graph)
_SKIP = {"_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range_for_size"}

_Fail = Callable[[str, str], ValidationError]


def load_factory(spec: str):
    """The callable ``pkg.module:factory`` names (imported as a script would be: the current
    folder first on the import path)."""
    if not isinstance(spec, str) or not _FACTORY.match(spec):
        raise ValueError(f"--torch {str(spec)[:80]!r}: expected MODULE:FUNCTION, e.g. mypkg.models:build")
    module, _, fn = spec.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"--torch {spec}: cannot import {module!r}: {e}") from None
    finally:
        sys.path.pop(0)
    factory = getattr(mod, fn, None)
    if not callable(factory):
        raise ValueError(f"--torch {spec}: {module!r} has no function {fn!r}")
    return factory


def import_torch(factory, *, unknown: str = "error", precision: str | None = None, name: str | None = None,
                 source: str = "factory") -> tuple[OpGraph, list[str]]:
    """The soapbox model of the module ``factory()`` returns, and notes.

    Raises
    ------
    ValidationError
        The factory's result is not (module, example inputs), the capture failed, or ops
        cannot be mapped (listed with counts).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    def fail(where: str, message: str) -> ValidationError:
        return ValidationError([Problem(where, message)], source)

    if unknown not in ("error", "elementwise"):
        raise ValueError(f"unknown must be 'error' or 'elementwise', got {unknown!r}")
    module, example, ep, notes = _capture(torch, factory, fail)
    torch_flops = _count_flops(FlopCounterMode, module, ep, example)
    s = _start(torch, ep, module, precision=precision, name=name, source=source, fail=fail)
    _walk(s, ep.graph, unknown)
    if s.problems:
        listed = "; ".join(f"{op} x {len(v)} (e.g. {', '.join(v[:3])})"
                           for op, v in sorted(s.unmapped.items(), key=lambda kv: -len(kv[1])))
        raise fail("graph", f"{s.problems} ATen call(s) soapbox cannot map: {listed}. Import shape-preserving ones "
                            "as memory-bound elementwise ops with --unknown elementwise")
    try:
        graph = s.b.build()
    except (OpError, ValueError) as e:
        raise fail("graph", str(e)) from None
    return graph, notes + _notes(graph, s.unmapped, torch_flops, module)


def _capture(torch: Any, factory, fail: _Fail) -> tuple[Any, tuple, Any, list[str]]:
    """The module and example inputs ``factory()`` makes on the meta device (a transformers
    model's key/value cache turned off, with a note), and their ``torch.export`` capture."""
    with torch.device("meta"):
        made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
        raise fail("factory", "must return (torch.nn.Module, example input or tuple of inputs)")
    module, example = made
    example = example if isinstance(example, tuple) else (example,)
    module = module.to("meta")
    notes = []
    config = getattr(module, "config", None)
    if getattr(config, "use_cache", False) is True:  # (transformers: a KV cache is for generation, not training)
        config.use_cache = False
        notes.append("use_cache turned off (a key/value cache is for generation; training keeps none)")
    example = tuple(x.to("meta") if isinstance(x, torch.Tensor) else x for x in example)
    try:
        ep = torch.export.export(module.eval(), example)
    except Exception as e:
        raise fail("torch.export", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}") from None
    return module, example, ep, notes


def _count_flops(counter_mode: Any, module, ep, example: tuple) -> float | None:
    """torch's own count of one forward pass's FLOPs (``FlopCounterMode``), or None when
    neither the module nor its capture runs on meta tensors."""
    torch_flops = None
    for run in (module, ep.module()):  # (the capture runs where eager code reads values: masks' .item())
        counter = counter_mode(display=False)
        try:
            with counter:
                run(*example)
            torch_flops = float(counter.get_total_flops())
            break
        except Exception:  # (neither runs on meta tensors: no cross-check)
            continue
    return torch_flops


def _start(torch: Any, ep, module, *, precision: str | None, name: str | None, source: str,
           fail: _Fail) -> TorchState:
    """The walk's state: the builder (its precision the first float input's, else the
    parameters'), shared parameters, RMSNorms spelled out, the integer inputs' shapes."""
    dtypes = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    sig = ep.graph_signature
    user_inputs = set(sig.user_inputs)
    g = ep.graph
    first_float = next((n.meta["val"].dtype for n in g.nodes if n.op == "placeholder" and n.name in user_inputs
                        and n.meta["val"].dtype in dtypes), None)
    param_dtype = next((p.dtype for p in module.parameters()), torch.float32)
    precision = precision or dtypes.get(first_float or param_dtype, "fp32")
    b = GraphBuilder(name or type(module).__name__[:200], precision,
                     f"imported from PyTorch ({type(module).__name__}) with torch.export", f"soapbox import --torch {source}")
    params = set(sig.inputs_to_parameters)
    tied = shared_parameters(ep, module)
    absorbed, norms, gains = rms_norms(g, params)
    int_inputs = [node_shape(n) for n in g.nodes if n.op == "placeholder" and n.name in user_inputs
                  and n.meta["val"].dtype in (torch.int64, torch.int32)]
    return TorchState(b, fail, precision, dtypes, user_inputs, params, tied, absorbed, norms, gains, int_inputs)


def _walk(s: TorchState, g, unknown: str) -> None:
    """Map every node of the captured graph in order: placeholders (inputs, or parameters and
    constants), ``getitem`` of a split, then each ATen call (:func:`convert`); calls on
    constants alone are folded, an unmapped call handled by :func:`_unmapped`."""
    for n in g.nodes:
        if n.op == "placeholder":
            _placeholder(s, n)
            continue
        if n.op != "call_function":
            continue
        target = n.target
        if n.name in s.absorbed:
            continue
        if target is operator.getitem:
            src, k = n.args
            if src.name in s.ref and isinstance(s.ref[src.name], list):
                s.ref[n.name] = s.ref[src.name][k]
            elif src.name in s.const:
                s.const[n.name] = node_shape(n)
            continue
        op = aten_name(target)
        if op in _SKIP:
            continue
        args = list(n.args)
        acts = [a for a in args if hasattr(a, "name") and a.name in s.ref]
        c = AtenCall(n, op, args, acts, node_shape(n), args[0] if args else None)
        if lookup_by_constant_ids(s, c):
            continue
        if not acts:
            s.const[n.name] = node_shape(n)  # (shape arithmetic on constants, the causal mask: it costs nothing)
            continue
        s.b.block = _module_block(n)  # (a numbered module's ops form a layer block: pipelines split them)
        try:
            convert(s, c)
        except ValidationError:
            raise
        except (Unmapped, TypeError, IndexError, KeyError, AttributeError, ValueError):  # (never a traceback)
            _unmapped(s, c, unknown)


def _module_block(n) -> str | None:
    """The layer block of a captured call: the outermost numbered module on its
    ``nn_module_stack`` (torch.export's record of the modules it ran in, outermost first)."""
    stack = n.meta.get("nn_module_stack") or {}
    paths = [str(v[0]) for v in stack.values() if isinstance(v, tuple) and v]
    return block_of_scopes(paths)


def _placeholder(s: TorchState, n) -> None:
    """A placeholder: a user input (float ones at the model's precision), else a parameter,
    buffer or constant (its shape kept)."""
    import torch

    shp = node_shape(n)
    if n.name in s.user_inputs and shp is not None:
        v = n.meta["val"]
        if v.dtype in s.dtypes:
            s.ref[n.name] = s.b.input(s.nm(n), list(shp), dtype=s.precision)
        else:
            axes = ["sample", "length"] if len(shp) == 2 else None
            s.ref[n.name] = s.b.input(s.nm(n), list(shp), dtype="int64" if v.dtype == torch.int64 else "int32",
                                      **({"axes": axes} if axes else {}))
    else:
        s.const[n.name] = shp


def _unmapped(s: TorchState, c: AtenCall, unknown: str) -> None:
    """A call no converter takes: an ``elementwise`` op (``unknown="elementwise"``, when it
    keeps its first argument's shape), or a problem, a stand-in input in its place."""
    import torch

    n, x = c.n, c.x
    if unknown == "elementwise" and x is not None and hasattr(x, "name") and x.name in s.ref and \
            node_shape(x) == c.out:
        emit(s, c, "elementwise", [x], flops_per_element=1.0, label=c.op)
    else:
        s.problems += 1
        # a stand-in input in its place, so the calls after it are mapped and listed too
        vals = n.meta.get("val")
        vals = vals if isinstance(vals, (tuple, list)) else [vals]
        stand_ins = [s.b.input(f"{n.name}.unmapped{i}", list(v.shape)) for i, v in enumerate(vals)
                     if isinstance(v, torch.Tensor)]
        if stand_ins:
            s.ref[n.name] = stand_ins if isinstance(n.meta.get("val"), (tuple, list)) else stand_ins[0]
    s.unmapped.setdefault(c.op, []).append(n.name)


def _notes(graph: OpGraph, unmapped: dict[str, list[str]], torch_flops: float | None, module) -> list[str]:
    """Notes on the built model: the calls imported as elementwise, soapbox's GEMM FLOPs beside
    torch's count, and the parameters beside torch's."""
    notes = []
    if unmapped:
        notes.append("imported as elementwise (memory-bound): " + "; ".join(
            f"{op} x {len(v)}" for op, v in sorted(unmapped.items())))
    if torch_flops is not None:
        mine = sum(o.fwd_flops for o in graph.ops if o.kind in ("linear", "batch_matmul", "conv2d", "attention"))
        # soapbox counts causal attention at half (the masked half is skipped, as FlashAttention
        # does); torch's counter counts the whole score matrix
        skipped = sum(o.fwd_flops for o in graph.ops if o.kind == "attention" and o.attrs.get("causal"))
        notes.append(f"forward GEMM-class FLOPs: torch.utils.flop_counter {torch_flops:.4g}, soapbox {mine:.4g}"
                     + (f" (+{skipped:.4g} causal attention skips)" if skipped else "")
                     + ("" if math.isclose(torch_flops, mine + skipped, rel_tol=0.01) else " (they differ)"))
    unique = sum(p.numel() for p in module.parameters())  # (a shared tensor once)
    notes.append(f"parameters: torch {unique:,}, soapbox {graph.param_count:,}"
                 + ("" if unique == graph.param_count else " (they differ: a parameter soapbox cannot place)"))
    return notes
