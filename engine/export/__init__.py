"""Plans a framework can run: a strategy as Megatron-LM flags, a DeepSpeed config or a
torchtitan launch line (``soapbox export``), each for a named release of its framework."""

from .infer import FORMATS, export, infer_layout
from ..layout.record import Layout
from ..search.baselines import build_layout
from .deepspeed import layout_from_deepspeed, to_deepspeed
from .megatron import layout_from_megatron, to_megatron
from .torchtitan import layout_from_torchtitan, to_torchtitan

__all__ = ["Layout", "infer_layout", "to_megatron", "to_deepspeed", "to_torchtitan", "FORMATS", "export",
           "layout_from_megatron", "layout_from_deepspeed", "layout_from_torchtitan", "build_layout"]
