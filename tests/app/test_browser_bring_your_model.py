"""Issue 44, the researcher bringing their own model, in a real headless Chromium: a Hugging
Face ``config.json`` and an ONNX file whose weights are external data go in through the upload
box; the model stays when the cluster changes; the same file can be uploaded twice."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Page, expect

from test_browser import open_app, pick, settled

pytestmark = pytest.mark.browser

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000,
         "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


def _onnx_with_external_weights(path) -> None:
    """A two-layer MLP whose weights are declared external data (the file they name does not
    exist: the importer must not need it)."""
    import onnx
    from onnx import TensorProto, helper

    def external(name, dims):
        t = onnx.TensorProto()
        t.name, t.data_type = name, TensorProto.FLOAT
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "model.onnx.data"), ("offset", "0"), ("length", str(4 * dims[0] * dims[1]))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return t

    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["a"], name="act"),
             helper.make_node("Gemm", ["a", "w2"], ["y"], name="fc2", transB=1)]
    g = helper.make_graph(nodes, "mlp-external", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
                          [external("w1", [128, 64]), external("w2", [10, 128])])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def test_a_hf_config_stays_across_clusters_and_uploads_again(page: Page, app_url: str, tmp_path):
    open_app(page, app_url)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    page.set_input_files("#upload input[type=file]", str(cfg))  # bf16 on the default P100s: refused, saying why
    expect(page.locator("#message")).to_contain_text("llama cannot run on p100-4x4")
    expect(page.locator("#message")).to_contain_text("Pick a cluster whose GPUs have it first")
    settled(page)
    pick(page, "pick-cluster", "dgx-a100-80gb:1")
    expect(page.locator("#message")).to_contain_text("Cluster: dgx-a100-80gb:1")
    settled(page)
    page.set_input_files("#upload input[type=file]", str(cfg))  # the same file again, now on A100s
    expect(page.locator("#message")).to_contain_text("Loaded model llama")
    expect(page.locator("#message")).to_contain_text("Hugging Face config")
    expect(page.locator("#pick-model")).to_contain_text("llama (uploaded)")
    settled(page)
    pick(page, "pick-cluster", "dgx-h100:1")
    expect(page.locator("#message")).to_contain_text("Cluster: dgx-h100:1")
    expect(page.locator("#pick-model")).to_contain_text("llama (uploaded)")
    settled(page)
    page.set_input_files("#upload input[type=file]", str(cfg))  # and again: the upload box takes it each time
    expect(page.locator("#message")).to_contain_text("Loaded model llama")


def test_an_onnx_file_with_external_data_is_imported_alone(page: Page, app_url: str, tmp_path):
    pytest.importorskip("onnx")
    open_app(page, app_url)
    path = tmp_path / "mlp.onnx"
    _onnx_with_external_weights(path)
    page.set_input_files("#upload input[type=file]", str(path))
    expect(page.locator("#message")).to_contain_text("Loaded model mlp-external")
    expect(page.locator("#message")).to_contain_text("external data")
