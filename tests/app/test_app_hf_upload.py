"""Issue 44: the page takes a Hugging Face ``config.json`` as ``soapbox import --hf`` does (the
header's batch, sequence length and precision then apply to it), and an uploaded model or
cluster stays when another cluster, size or layout is picked (it was swapped for Inception-v3).
Callbacks called as plain functions (no Dash server)."""

from __future__ import annotations

import base64
import json

import pytest

from app import events as EV
from app.simulation import workspace
from app.sources import HF_BATCH, cluster_of, graph_of
from app.state import new_state
from engine.cluster import preset
from engine.models.hf import from_hf_config
from engine.sim.report import tokens_per_sample

#: a small LLaMA-shaped config as the Hub writes one (extra fields included)
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "transformers_version": "4.44.0"}


def upload(state: dict, data, filename: str = "config.json") -> tuple[dict, str]:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return EV.on_event("upload", state, upload="data:application/json;base64," + base64.b64encode(raw).decode(),
                       filename=filename)


@pytest.fixture
def start() -> dict:
    return new_state("gpt2", "dgx-a100-80gb:1", batch=8)


def test_a_hf_config_is_imported_as_the_cli_does(start):
    new, msg = upload(start, LLAMA)
    assert msg.startswith("Loaded model llama (") and "Hugging Face config" in msg, msg
    g = graph_of(new)
    cli = from_hf_config(LLAMA, batch=HF_BATCH)
    assert g.param_count == cli.param_count and len(g.ops) == len(cli.ops)
    assert g.batch_size == HF_BATCH and tokens_per_sample(g) == 2048 and g.precision == "bf16"
    assert f"{HF_BATCH:,} sequences of 2,048 tokens in bf16" in msg
    assert workspace(new).timeline.makespan_s > 0


def test_the_header_sizes_apply_to_an_uploaded_config(start):
    new, _ = upload(start, LLAMA)
    smaller, msg = EV.on_event("pick-batch", new, batch=64)
    assert msg.startswith("Batch: 64 samples"), msg
    assert graph_of(smaller).batch_size == 64 and smaller["model"]["upload"] == new["model"]["upload"]
    shorter, msg = EV.on_event("pick-seq", smaller, size=512)
    assert tokens_per_sample(graph_of(shorter)) == 512 and graph_of(shorter).batch_size == 64, msg
    assert graph_of(shorter).param_count == graph_of(new).param_count


def test_picking_a_cluster_keeps_the_uploaded_model(start):
    new, _ = upload(start, LLAMA)
    moved, msg = EV.on_event("pick-cluster", new, cluster="dgx-h100:2")
    assert moved["model"] == new["model"], msg
    assert graph_of(moved).name == "llama" and cluster_of(moved).num_devices == 16


def test_an_uploaded_soapbox_model_stays_too_and_keeps_its_own_sizes(start):
    g = from_hf_config(LLAMA, batch=16)
    new, msg = upload(start, g.to_dict(), "llama.json")
    assert msg.startswith("Loaded model"), msg
    moved, _ = EV.on_event("pick-cluster", new, cluster="dgx-h100:1")
    assert moved["model"] == new["model"] and graph_of(moved).param_count == g.param_count
    same, msg = EV.on_event("pick-batch", moved, batch=64)
    assert same is moved and "states its own" in msg


def test_an_uploaded_cluster_stays_when_the_model_changes(start):
    c = preset("dgx-h100:2").to_dict()
    c["name"] = "my-cluster"
    new, msg = upload(start, c, "cluster.json")
    assert msg.startswith("Loaded cluster my-cluster"), msg
    other, msg = EV.on_event("pick-model", new, model="llama2-7b")
    assert other["cluster"] == new["cluster"] and cluster_of(other).name == "my-cluster", msg


def test_a_config_soapbox_cannot_read_is_refused_with_what_and_where(start):
    same, msg = upload(start, {"model_type": "whisper", "d_model": 512})
    assert same is start
    assert msg.startswith("Import refused: config.json: a Hugging Face config soapbox cannot import (") and \
        "whisper" in msg, msg
