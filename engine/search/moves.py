"""The moves of one strategy space: besides one op's SOAP config (:mod:`engine.search.mcmc`),
the settings that hold for the whole strategy and the layouts that change many ops at once.

Every move maps a strategy to a candidate strategy (or to nothing where it does not apply);
the candidate is checked whole by :func:`engine.strategy.validate_strategy`, the loader's own
check, before it is priced, so a move can never produce a strategy the loader would refuse.

Kinds (:data:`GLOBAL_KINDS`):

``recompute``
    activation recomputation none / selective / full (Korthikanti et al. 2022).
``zero``
    ZeRO stage 0-3 over each data-parallel group (Rajbhandari et al. SC'20); applies where
    some weight has data-parallel replicas.
``microbatches``
    halve or double the number of microbatches (gradient accumulation on one stage, the
    pipeline's microbatches on several).
``schedule``
    GPipe against 1F1B (Huang et al. 2019; Narayanan et al. 2019) on a pipelined strategy.
``split``
    the layer split between pipeline chunks: the layer on one side of a chunk boundary moves
    across it, onto the devices of the chunk it joins (Alpa's stage boundaries, Zheng et al.
    OSDI'22, one layer at a time).
``block``
    the (data, context, tensor)-parallel degrees of one block of ops (a transformer layer, a
    ResNet bottleneck) as one move: every op of the block re-laid on the block's devices as
    Megatron lays a layer (:func:`engine.layout.placement.mesh_config`); a block with experts
    also takes every expert-parallel shape (ep, etp) that folds onto its mesh
    (:func:`engine.layout.placement.expert_config`).
``layout``
    a whole Megatron-shaped layout (tp, pp, cp, micro-batch; of a mixture-of-experts model ep
    and etp too, :func:`engine.layout.valid_layouts`) keeping the strategy's recomputation,
    ZeRO stage and precision: a jump to another region of the space, for models with
    numbered layers.

:meth:`Space.propose` draws a random move of a kind; :meth:`Space.neighbours` lists every
move of a kind from a strategy (the final polish checks them all, so the answer is a local
optimum under every kind).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Iterator

from ..cluster import Cluster
from ..graph import OpGraph
from ..layout import (MAX_CP, MAX_MICROBATCHES_PER_STAGE, MIN_CP_TOKENS, Layout, expert_shapes, mesh_shapes,
    valid_layouts)
from ..strategy import MAX_MICROBATCHES, RECOMPUTE, Config, Strategy, splits_into_microbatches
from ..layout.placement import expert_config, mesh_config, tp_plan
from ..graph.blocks import layer_blocks

__all__ = ["GLOBAL_KINDS", "Space"]

GLOBAL_KINDS = ("recompute", "zero", "microbatches", "schedule", "split", "block", "layout")

#: the most candidates :meth:`Space.neighbours` lists for one kind (the layouts of a large
#: cluster run to hundreds; the nearest come first)
MAX_NEIGHBOURS = 64


class Space:
    """The moves available for strategies of ``graph`` on ``cluster``."""

    def __init__(self, graph: OpGraph, cluster: Cluster) -> None:
        self.graph, self.cluster = graph, cluster
        self.layers = layer_blocks(graph)
        blocks: dict[str, list[str]] = {}
        for op in graph.ops:
            if op.block and op.kind != "input":
                blocks.setdefault(op.block, []).append(op.name)
        # blocks worth re-laying as one: more than one op, at least one with weights
        self.blocks = {b: names for b, names in blocks.items()
                       if len(names) > 1 and any(graph[n].param_count for n in names)}
        self._block_names = sorted(self.blocks)
        self._plans: dict[tuple[int, bool], dict | None] = {}
        self._layer_ops = {b: [n for n in self.blocks.get(b, [])] for b in self.layers}
        self._has_length = any("length" in op.dim_names for op in graph.ops)
        seqs = [op.dim("length").size for op in graph.ops if "length" in op.dim_names]
        self._max_cp = max(1, min(MAX_CP, min(seqs, default=0) // MIN_CP_TOKENS))
        self._mesh_cache: dict[tuple[int, bool, bool], list[tuple[int, int, int]]] = {}
        self._layouts: dict[bool, list[Layout]] = {}  # sequence parallel -> the valid layouts, nearest first

    # ------------------------------------------------------------------ which kinds apply

    def kinds(self, s: Strategy) -> list[str]:
        """The global kinds that can move ``s``."""
        out = ["recompute", "microbatches"]
        if any(c.degree("sample") > 1 or c.degree("length") > 1 for c in s.configs.values()):
            out.append("zero")
        if s.pipeline.stages > 1 and s.pipeline.virtual_stages == 1:
            out.append("schedule")
        if s.pipeline.stages * s.pipeline.virtual_stages > 1 and self.layers:
            out.append("split")
        if self.blocks:
            out.append("block")
        if self.layers:
            out.append("layout")
        return out

    def propose(self, s: Strategy, kind: str, rng: random.Random) -> Strategy | None:
        """A random move of ``kind`` from ``s`` (None when there is none); not yet validated."""
        options = list(self._moves(s, kind, rng))
        return rng.choice(options) if options else None

    def neighbours(self, s: Strategy, kind: str) -> Iterator[Strategy]:
        """Every move of ``kind`` from ``s`` (at most :data:`MAX_NEIGHBOURS`), not yet validated."""
        for k, cand in enumerate(self._moves(s, kind, None)):
            if k >= MAX_NEIGHBOURS:
                return
            yield cand

    # ------------------------------------------------------------------ the moves

    def _moves(self, s: Strategy, kind: str, rng: random.Random | None) -> Iterator[Strategy]:
        """The candidates of one kind; with ``rng``, a random subset where listing all would
        cost much more than drawing one (blocks, layouts)."""
        if kind == "recompute":
            for r in RECOMPUTE:
                if r != s.recompute:
                    yield replace(s, recompute=r)
        elif kind == "zero":
            for z in (0, 1, 2, 3):
                if z != s.zero_stage:
                    yield replace(s, zero_stage=z, shard_group=s.shard_group if z >= 2 else 0)
        elif kind == "microbatches":
            yield from self._microbatch_moves(s)
        elif kind == "schedule":
            for sched in ("gpipe", "1f1b"):
                if sched != s.pipeline.schedule and s.pipeline.virtual_stages == 1:
                    yield replace(s, pipeline=replace(s.pipeline, schedule=sched))
        elif kind == "split":
            yield from self._split_moves(s)
        elif kind == "block":
            names = self._block_names if rng is None else [rng.choice(self._block_names)] if self._block_names else []
            for b in names:
                yield from self._block_moves(s, b)
        elif kind == "layout":
            yield from self._layout_moves(s, rng)
        else:
            raise ValueError(f"unknown move kind {kind!r}; kinds: {', '.join(GLOBAL_KINDS)}")

    def _microbatch_moves(self, s: Strategy) -> Iterator[Strategy]:
        # every op's per-partition batch must split into the microbatches (check_config's rule)
        split = {(op.dim("sample").size, s.configs[op.name].degree("sample"))
                 for op in self.graph.ops if "sample" in op.dim_names and op.name in s.configs}
        limit = min((size // deg for size, deg in split), default=1)
        m = s.pipeline.microbatches
        stages = s.pipeline.stages
        cap = min(limit, MAX_MICROBATCHES, max(m, MAX_MICROBATCHES_PER_STAGE * stages))
        for new in (m * 2, m // 2):
            if 1 <= new <= cap and new != m and all(splits_into_microbatches(size, deg, new) for size, deg in split):
                if s.pipeline.schedule == "interleaved" and new % stages:
                    continue
                yield replace(s, pipeline=replace(s.pipeline, microbatches=new))

    def _chunk_devices(self, s: Strategy) -> dict[int, list[int]]:
        """Sorted devices of each pipeline stage (chunks c and c + stages share a stage)."""
        n = s.pipeline.stages
        devs: dict[int, set[int]] = {}
        for name, cfg in s.configs.items():
            c = s.stage_of.get(name)
            if c is not None:
                devs.setdefault(c % n, set()).update(cfg.devices)
        return {k: sorted(v) for k, v in devs.items()}

    def _split_moves(self, s: Strategy) -> Iterator[Strategy]:
        chunks = s.pipeline.stages * s.pipeline.virtual_stages
        owner = {}
        for b in self.layers:
            ops = self._layer_ops[b]
            if ops and ops[0] in s.stage_of:
                owner[b] = s.stage_of[ops[0]]
        by_chunk: dict[int, list[str]] = {}
        for b in self.layers:
            if b in owner:
                by_chunk.setdefault(owner[b], []).append(b)
        stage_devs = self._chunk_devices(s)
        order = {op.name: i for i, op in enumerate(self.graph.ops)}
        for c in range(chunks - 1):
            left, right = by_chunk.get(c, []), by_chunk.get(c + 1, [])
            if len(left) > 1:  # the last layer of chunk c joins chunk c + 1
                yield from self._move_layer(s, left[-1], c, c + 1, stage_devs, order, ahead=False)
            if len(right) > 1:  # the first layer of chunk c + 1 joins chunk c
                yield from self._move_layer(s, right[0], c + 1, c, stage_devs, order, ahead=True)

    def _move_layer(self, s: Strategy, layer: str, src: int, dst: int, stage_devs: dict[int, list[int]],
                    order: dict[str, int], ahead: bool) -> Iterator[Strategy]:
        n = s.pipeline.stages
        a, b = stage_devs.get(src % n, []), stage_devs.get(dst % n, [])
        if len(a) != len(b):
            return  # (stages of different sizes: no one-to-one map of the layer's devices)
        remap = dict(zip(a, b))
        moving = list(self._layer_ops[layer])
        if ahead:  # ops that are no layer's and sit before the layer join it (layer_chunks' rule)
            first = order[moving[0]]
            moving += [op.name for op in self.graph.ops if s.stage_of.get(op.name) == src and
                       order[op.name] < first and op.kind != "input" and op.block not in self._layer_ops]
        configs = dict(s.configs)
        stage_of = dict(s.stage_of)
        for name in moving:
            cfg = configs[name]
            configs[name] = Config(cfg.degrees, tuple(remap.get(d, d) for d in cfg.devices))
            stage_of[name] = dst
        for op in self.graph.ops:  # inputs sit with their first consumer
            if op.kind == "input" and op.name in stage_of:
                users = [stage_of[c] for c in self.graph.consumers(op.name) if c in stage_of]
                if users and min(users) != stage_of[op.name]:
                    new = min(users)
                    src_devs, dst_devs = stage_devs.get(stage_of[op.name] % n, []), stage_devs.get(new % n, [])
                    if len(src_devs) == len(dst_devs):
                        m = dict(zip(src_devs, dst_devs))
                        cfg = configs[op.name]
                        configs[op.name] = Config(cfg.degrees, tuple(m.get(d, d) for d in cfg.devices))
                    stage_of[op.name] = new
        yield replace(s, configs=configs, stage_of=stage_of)

    def _meshes(self, size: int, context: bool, sequence_parallel: bool) -> list[tuple[int, int, int]]:
        """The (tp, cp, dp) meshes of ``size`` devices (:func:`engine.layout.mesh_shapes`), cached."""
        key = (size, context, sequence_parallel)
        if key not in self._mesh_cache:
            self._mesh_cache[key] = mesh_shapes(self.graph, self.cluster, size, max_cp=self._max_cp if context else 1,
                                                sequence_parallel=sequence_parallel)
        return self._mesh_cache[key]

    def _plan(self, tp: int, sequence_parallel: bool) -> dict | None:
        key = (tp, sequence_parallel)
        if key not in self._plans:
            try:
                self._plans[key] = tp_plan(self.graph, tp, sequence_parallel)[0]
            except ValueError:
                self._plans[key] = None
        return self._plans[key]

    def _block_moves(self, s: Strategy, block: str) -> Iterator[Strategy]:
        names = self.blocks[block]
        devices = sorted({d for n in names for d in s.configs[n].devices})
        size = len(devices)
        ctx = self._has_length and any("length" in self.graph[n].dim_names for n in names)
        current = {n: s.configs[n] for n in names}
        experts = [n for n in names if self.graph[n].kind == "experts"]
        for tp, cp, dp in self._meshes(size, ctx, s.sequence_parallel):
            plan = self._plan(tp, s.sequence_parallel) if tp > 1 else None
            if tp > 1 and (plan is None or (experts and not s.sequence_parallel)):
                continue  # (Megatron-LM: MoE with tensor parallelism needs sequence parallelism)
            configs = dict(s.configs)
            for n in names:
                dim, deg = plan[n] if plan is not None else (None, 1)
                configs[n] = mesh_config(self.graph[n], dim, deg, dp, cp, tp, devices)
            # a block with experts: every (ep, etp) that folds onto the mesh (Megatron-Core's
            # parallel folding, engine.layout.experts.expert_shapes), the experts' ops re-laid with it
            for ep, etp in expert_shapes(self.graph, tp, cp, dp) if experts else [(1, 1)]:
                for n in experts:
                    configs[n] = expert_config(self.graph[n], dp, cp, tp, ep, etp, devices)
                if any(configs[n] != current[n] for n in names):
                    yield replace(s, configs=dict(configs))

    def _layout_moves(self, s: Strategy, rng: random.Random | None) -> Iterator[Strategy]:
        from ..layout.build import build_layout  # (baselines imports layouts; this module is imported by mcmc)

        sp = s.sequence_parallel
        if sp not in self._layouts:
            lays = list(valid_layouts(self.graph, self.cluster, max_cp=self._max_cp, sequence_parallel=sp))
            # the nearest layouts first (fewest model-parallel ranks, then the largest micro-batch;
            # of a mixture-of-experts model, the fewest expert-parallel ranks among those)
            lays.sort(key=lambda x: (x.tp * x.pp * x.cp, x.pp, x.cp, x.ep * x.etp, x.ep, -(x.micro_batch or 0)))
            self._layouts[sp] = lays
        layouts = self._layouts[sp]
        if rng is not None:
            layouts = [rng.choice(layouts)] if layouts else []
        for lay in layouts:
            try:
                cand = build_layout(self.graph, self.cluster,
                                    replace(lay, recompute=s.recompute, zero_stage=s.zero_stage, fp8=s.fp8))
            except ValueError:
                continue
            yield replace(cand, found_by={}, cost={})
