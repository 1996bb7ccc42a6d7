"""Plans a framework can run: a strategy as Megatron-LM flags, a DeepSpeed config or a
torchtitan launch line (``soapbox export``), each for a named release of its framework.

* :mod:`engine.export.refusals`: what an export says when a framework cannot run a plan as
  simulated (the vocabulary every format shares);
* :mod:`engine.export.infer`: the layout a strategy is (or why it is none), and the one entry
  point :func:`export`;
* :mod:`engine.export.megatron` (with :mod:`engine.export.megatron_model`, the model's own
  flags), :mod:`engine.export.deepspeed`, :mod:`engine.export.torchtitan`: one module per
  framework release, each citing the source files its names and rules were read from;
* :mod:`engine.export.moe`: what the three say of mixture-of-experts models and MLA.
"""

from .deepspeed import layout_from_deepspeed, to_deepspeed
from .infer import EXPORT_FORMATS, export, infer_layout
from .megatron import layout_from_megatron, to_megatron
from .torchtitan import layout_from_torchtitan, to_torchtitan

__all__ = ["export", "infer_layout", "EXPORT_FORMATS", "to_megatron", "to_deepspeed", "to_torchtitan",
           "layout_from_megatron", "layout_from_deepspeed", "layout_from_torchtitan"]
