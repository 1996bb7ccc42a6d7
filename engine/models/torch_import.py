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
"""

from __future__ import annotations

import importlib
import math
import operator
import os
import re
import sys
from collections import Counter
from typing import Any

from ..errors import Problem, ValidationError
from ..graph import GraphBuilder, OpGraph, TensorRef
from ..ops import OpError
from .torch_patterns import PASS_THROUGH, aten_name, rms_norms, shared_parameters

__all__ = ["import_torch", "load_factory"]

_FACTORY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")

_UNARY = {"relu": "relu", "gelu": "gelu", "silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh"}
_BINARY = {"add": "add", "sub": "add", "mul": "mul", "div": "mul"}
_VIEWS = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "expand_as"}
_GENERIC = {"rsqrt": 2.0, "sqrt": 1.0, "exp": 4.0, "pow": 2.0, "neg": 1.0, "reciprocal": 1.0, "erf": 8.0,
            "log": 4.0, "abs": 1.0, "clamp": 2.0, "mean": 1.0, "hardtanh": 2.0, "leaky_relu": 2.0,
            "hardswish": 4.0, "hardsigmoid": 3.0, "elu": 4.0, "sin": 4.0, "cos": 4.0}
#: calls with no tensor result that soapbox skips (checks torch.export leaves in the graph)
_SKIP = {"_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range_for_size"}


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
    torch_flops = None
    for run in (module, ep.module()):  # (the capture runs where eager code reads values: masks' .item())
        counter = FlopCounterMode(display=False)
        try:
            with counter:
                run(*example)
            torch_flops = float(counter.get_total_flops())
            break
        except Exception:  # (neither runs on meta tensors: no cross-check)
            continue

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
    ref: dict[str, Any] = {}  # fx node name -> TensorRef, or a list of them (a split)
    const: dict[str, tuple] = {}  # parameters, buffers and constants: name -> shape
    split_cache: dict[tuple, list[TensorRef]] = {}
    unmapped: dict[str, list[str]] = {}
    problems = 0
    used = Counter()
    params = set(sig.inputs_to_parameters)
    tied = shared_parameters(ep, module)
    absorbed, norms, gains = rms_norms(g, params)

    def shape(n) -> tuple[int, ...] | None:
        v = n.meta.get("val") if hasattr(n, "meta") else None
        return tuple(int(d) for d in v.shape) if isinstance(v, torch.Tensor) else None

    int_inputs = [shape(n) for n in g.nodes if n.op == "placeholder" and n.name in user_inputs
                  and n.meta["val"].dtype in (torch.int64, torch.int32)]

    def nm(n) -> str:
        used[n.name] += 1
        return n.name if used[n.name] == 1 else f"{n.name}.{used[n.name]}"

    for n in g.nodes:
        if n.op == "placeholder":
            shp = shape(n)
            if n.name in user_inputs and shp is not None:
                v = n.meta["val"]
                if v.dtype in dtypes:
                    ref[n.name] = b.input(nm(n), list(shp), dtype=precision)
                else:
                    axes = ["sample", "length"] if len(shp) == 2 else None
                    ref[n.name] = b.input(nm(n), list(shp), dtype="int64" if v.dtype == torch.int64 else "int32",
                                          **({"axes": axes} if axes else {}))
            else:
                const[n.name] = shp
            continue
        if n.op != "call_function":
            continue
        target = n.target
        if n.name in absorbed:
            continue
        if target is operator.getitem:
            src, k = n.args
            if src.name in ref and isinstance(ref[src.name], list):
                ref[n.name] = ref[src.name][k]
            elif src.name in const:
                const[n.name] = shape(n)
            continue
        op = aten_name(target)
        if op in _SKIP:
            continue
        args = list(n.args)
        acts = [a for a in args if hasattr(a, "name") and a.name in ref]
        out = shape(n)
        if op == "embedding" and not acts and args[0].name in params and shape(args[1]) is not None:
            # a table looked up by constant ids (positions from arange): ids become an input,
            # one row per sample as the token ids have, so that the table stays a parameter
            ids = shape(args[1])
            tokens = next((s for s in int_inputs if len(ids) == 2 and ids[0] == 1 and s and len(s) == 2
                           and s[1] == ids[1]), None)  # [batch, seq] of the token ids
            name_ = nm(n)
            pos = b.input(f"{name_}.ids", list(tokens or ids), dtype="int64",
                          **({"axes": ["sample", "length"]} if tokens else {}))
            v, d = const[args[0].name]
            ref[n.name] = b.add("embedding", name_, [pos], num_embeddings=v, embedding_dim=d,
                                param_group=tied.get(args[0].name))
            continue
        if not acts:
            const[n.name] = shape(n)  # (shape arithmetic on constants, the causal mask: it costs nothing)
            continue

        def add(kind: str, inputs, **attrs: Any):
            try:
                r = b.add(kind, nm(n), [ref[a.name] if hasattr(a, "name") else a for a in inputs], **attrs)
            except (OpError, ValueError) as e:
                raise fail(f"node {n.name} ({op})", f"as soapbox {kind}: {e}") from None
            if not isinstance(r, list) and out is not None and tuple(b.shape_of(r)) != out:
                raise fail(f"node {n.name} ({op})", f"soapbox's {kind} gives {list(b.shape_of(r))}, torch {list(out)}")
            ref[n.name] = r
            return r

        x = args[0] if args else None
        try:
            if n.name in norms:
                add("rmsnorm", [ref[norms[n.name]]])
            elif n.name in gains:  # (the rmsnorm's gain)
                ref[n.name] = ref[gains[n.name]]
            elif op == "linear" and x.name in ref and args[1].name in const:
                bias, group = len(args) > 2 and args[2] is not None, tied.get(args[1].name)
                if bias and group:  # (BERT's MLM decoder: its own bias beside the tied weight, a bias op)
                    name_ = nm(n)
                    try:
                        lin = b.add("linear", name_, [ref[x.name]], out_features=const[args[1].name][0], bias=False,
                                    param_group=group)
                        ref[n.name] = b.add("bias", f"{name_}.bias", [lin])
                    except (OpError, ValueError) as e:
                        raise fail(f"node {n.name} ({op})", f"as soapbox linear and bias: {e}") from None
                else:
                    add("linear", [x], out_features=const[args[1].name][0], bias=bias, param_group=group)
            elif op in ("mm", "matmul") and len(acts) == 1 and x.name in ref and args[1].name in const:
                add("linear", [x], out_features=const[args[1].name][-1], bias=False)
            elif op == "addmm" and args[1].name in ref and args[2].name in const:
                add("linear", [args[1]], out_features=const[args[2].name][-1], bias=True)
            elif op in ("matmul", "bmm") and len(acts) == 2:
                add("batch_matmul", acts)
            elif op in ("conv2d", "convolution") and args[1].name in const:
                w = const[args[1].name]
                stride = list(args[3]) if len(args) > 3 else [1, 1]
                pad = list(args[4]) if len(args) > 4 else [0, 0]
                dil = list(args[5]) if len(args) > 5 else [1, 1]
                if op == "convolution" and (args[6] if len(args) > 6 else False):
                    raise _Unmapped()
                groups = int(args[8] if op == "convolution" and len(args) > 8 else (args[6] if op == "conv2d"
                                                                                   and len(args) > 6 else 1))
                if any(d != 1 for d in dil) or len(w) != 4:
                    raise _Unmapped()
                add("conv2d", [x], out_channels=w[0], kernel=[w[2], w[3]], stride=stride, padding=pad,
                    groups=groups, bias=len(args) > 2 and args[2] is not None)
            elif op in ("max_pool2d", "avg_pool2d", "max_pool2d_with_indices"):
                kern = list(args[1])
                stride = list(args[2]) if len(args) > 2 and args[2] else kern
                pad = list(args[3]) if len(args) > 3 else [0, 0]
                r = add("pool2d", [x], mode="avg" if op == "avg_pool2d" else "max", kernel=kern, stride=stride,
                        padding=pad)
                if op == "max_pool2d_with_indices":
                    ref[n.name] = [r, r]
            elif op == "adaptive_avg_pool2d" and list(args[1]) == [1, 1]:
                add("pool2d", [x], mode="avg", **{"global": True})
            elif op in ("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm",
                        "_native_batch_norm_legit"):
                r = add("batchnorm", [x])
                if op != "batch_norm":
                    ref[n.name] = [r, r, r]
            elif op in ("layer_norm", "native_layer_norm"):
                r = add("layernorm", [x])
                if op == "native_layer_norm":
                    ref[n.name] = [r, r, r]
            elif op == "rms_norm":
                add("rmsnorm", [x])
            elif op in _UNARY:
                add(_UNARY[op], [x])
            elif op == "dropout":
                add("dropout", [x], rate=float(args[1]) if len(args) > 1 else 0.5)
            elif op in ("softmax", "_softmax"):
                add("softmax", [x], axis=int(args[1]))
            elif op in _BINARY and len(acts) == 2 and shape(acts[0]) == shape(acts[1]) == out:
                add(_BINARY[op], acts)
            elif (op in _BINARY or op in _GENERIC) and x is not None and hasattr(x, "name") and x.name in ref \
                    and shape(x) == out:
                add("elementwise", [x], flops_per_element=_GENERIC.get(op, 1.0), label=op)
            elif op == "scaled_dot_product_attention":
                causal = bool(n.kwargs.get("is_causal", args[5] if len(args) > 5 else False))
                add("attention", acts[:3], causal=causal)
            elif op == "embedding" and args[0].name in const:
                v, d = const[args[0].name]
                add("embedding", [args[1]], num_embeddings=v, embedding_dim=d, param_group=tied.get(args[0].name))
            elif op in _VIEWS and out is not None:
                add("reshape", [x], shape=list(out))
            elif op in ("transpose", "t", "permute"):
                rank = len(shape(x))
                if op == "permute":
                    perm = [int(p) % rank for p in args[1]]
                else:
                    d0, d1 = (int(args[1]) % rank, int(args[2]) % rank) if op == "transpose" else (0, 1)
                    perm = list(range(rank))
                    perm[d0], perm[d1] = perm[d1], perm[d0]
                add("transpose", [x], perm=perm)
            elif op == "cat" and all(hasattr(a, "name") and a.name in ref for a in args[0]):
                add("concat", list(args[0]), axis=int(args[1]) if len(args) > 1 else 0)
            elif op == "select":
                rank = len(shape(x))
                axis = int(args[1]) % rank
                key = (x.name, axis)
                if key not in split_cache:
                    size = shape(x)[axis]
                    try:
                        rs = b.add("split", f"{x.name}.select{axis}", [ref[x.name]], axis=axis, sizes=[1] * size,
                                   squeeze=True)
                    except (OpError, ValueError) as e:
                        raise fail(f"node {n.name} (select)", f"as soapbox split: {e}") from None
                    split_cache[key] = rs if isinstance(rs, list) else [rs]
                ref[n.name] = split_cache[key][int(args[2]) % shape(x)[axis]]
            elif op in ("split", "split_with_sizes", "chunk"):
                rank = len(shape(x))
                axis = int(args[2]) % rank if len(args) > 2 else 0
                outs = [tuple(int(d) for d in v.shape) for v in n.meta["val"]]
                r = add("split", [x], axis=axis, sizes=[o[axis] for o in outs])
                ref[n.name] = r if isinstance(r, list) else [r]
            elif op == "expand" and out is not None:
                ref[n.name] = _expand(b, ref[x.name], shape(x), out, n.name)
            elif op == "slice" and out is not None and (args[4] if len(args) > 4 else 1) == 1:
                axis = int(args[1]) % len(out)
                size = shape(x)[axis]
                start = min(max(int(args[2]) + (size if int(args[2]) < 0 else 0), 0), size) if len(args) > 2 else 0
                pieces = [p for p in (start, out[axis], size - start - out[axis]) if p]
                r = add("split", [x], axis=axis, sizes=pieces) if len(pieces) > 1 else ref[x.name]
                ref[n.name] = r[0 if start == 0 else 1] if isinstance(r, list) else r
            elif op in PASS_THROUGH:
                ref[n.name] = ref[x.name]
                used[n.name] -= 1
            else:
                raise _Unmapped()
        except ValidationError:
            raise
        except (_Unmapped, TypeError, IndexError, KeyError, AttributeError, ValueError):  # (never a traceback)
            if unknown == "elementwise" and x is not None and hasattr(x, "name") and x.name in ref and \
                    shape(x) == out:
                add("elementwise", [x], flops_per_element=1.0, label=op)
            else:
                problems += 1
                # a stand-in input in its place, so the calls after it are mapped and listed too
                vals = n.meta.get("val")
                vals = vals if isinstance(vals, (tuple, list)) else [vals]
                stand_ins = [b.input(f"{n.name}.unmapped{i}", list(v.shape)) for i, v in enumerate(vals)
                             if isinstance(v, torch.Tensor)]
                if stand_ins:
                    ref[n.name] = stand_ins if isinstance(n.meta.get("val"), (tuple, list)) else stand_ins[0]
            unmapped.setdefault(op, []).append(n.name)
    if problems:
        listed = "; ".join(f"{op} x {len(v)} (e.g. {', '.join(v[:3])})"
                           for op, v in sorted(unmapped.items(), key=lambda kv: -len(kv[1])))
        raise fail("graph", f"{problems} ATen call(s) soapbox cannot map: {listed}. Import shape-preserving ones "
                            "as memory-bound elementwise ops with --unknown elementwise")
    try:
        graph = b.build()
    except (OpError, ValueError) as e:
        raise fail("graph", str(e)) from None
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
    return graph, notes


def _expand(b: GraphBuilder, r: TensorRef, have: tuple[int, ...], want: tuple[int, ...], name: str) -> TensorRef:
    """``expand`` as soapbox ops: a reshape adding the leading axes, then a ``broadcast`` per
    size-1 axis that grows (grouped-query attention's repeated key/value heads)."""
    if len(want) > len(have):
        have = (1,) * (len(want) - len(have)) + tuple(have)
        r = b.add("reshape", f"{name}.lead", [r], shape=list(have))
    for axis, (h, w) in enumerate(zip(have, want)):
        if h != w:
            r = b.add("broadcast", f"{name}.axis{axis}", [r], axis=axis, size=w)
    return r


class _Unmapped(Exception):
    """This ATen call has no soapbox op."""
