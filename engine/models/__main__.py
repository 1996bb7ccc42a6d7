"""Regenerate ``sample_models/*.json`` from the builders: ``python -m engine.models``."""

from __future__ import annotations

import sys

from ..formats import save_json
from . import SAMPLE_MODELS, build_sample, sample_dir


def main() -> int:
    out = sample_dir()
    for name in SAMPLE_MODELS:
        g = build_sample(name)
        save_json(g.to_dict(), out / f"{name}.json")
        print(f"{name}: {len(g)} ops, {g.param_count:,} parameters -> {out / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
