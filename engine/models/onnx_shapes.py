"""ONNX's shape inference for the importer (:mod:`engine.models.onnx_import`), run with the
large initializers' values set aside (:func:`infer_shapes_light`)."""

from __future__ import annotations

from typing import Any

__all__ = ["infer_shapes_light", "LIGHT_BYTES"]

#: initializers above this many bytes go to ONNX's shape inference without their values (it
#: reads their dims; only small integer tensors, shapes, feed its data propagation)
LIGHT_BYTES = 4096


def infer_shapes_light(model: Any, **options: Any) -> Any:
    """``onnx.shape_inference.infer_shapes(model, **options)`` with the large initializers'
    values set aside while it runs (it serialises the whole model, weights included, to run:
    most of an import's time on a large file), then put back in the model it returns."""
    from onnx import shape_inference

    stash = {}
    for t in model.graph.initializer:
        if len(t.raw_data) > LIGHT_BYTES:
            stash[t.name] = t.raw_data
            t.ClearField("raw_data")
    try:
        out = shape_inference.infer_shapes(model, **options)
    finally:
        for t in model.graph.initializer:
            if t.name in stash:
                t.raw_data = stash[t.name]
    for t in out.graph.initializer:
        if t.name in stash:
            t.raw_data = stash[t.name]
    return out
