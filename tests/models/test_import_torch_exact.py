"""Issue 27: ``soapbox import --torch`` is exact on real models.

torchvision's ResNet-18 and ResNet-50 (written out here in plain torch, as torchvision builds
them, in-place ReLUs and ``out += identity`` included) and transformers' eager GPT-2 and LLaMA
(tiny configs) import through the command line; the imported parameters equal
``sum(p.numel() for p in module.parameters())`` (a shared tensor once: GPT-2's ``lm_head`` is its
token embedding) and the GEMM-class forward FLOPs (linear, batch_matmul, conv2d) equal
``torch.utils.flop_counter.FlopCounterMode``'s count of the same forward on CPU. The eager
attentions import as batch_matmul + softmax, which both count in full; there is no causal
halving to state (that applies to a causal fused ``attention`` op only: see the sdpa cases)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from engine.cli import main
from engine.errors import ValidationError
from engine.formats import load_model
from engine.models.torch_import import import_torch

GEMM_KINDS = ("linear", "batch_matmul", "conv2d", "attention")


# --------------------------------------------------------------------------- torchvision's ResNets

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # (v1.5: the stride on the 3x3)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(block, 64, layers[0])
        self.layer2 = self._layer(block, 128, layers[1], 2)
        self.layer3 = self._layer(block, 256, layers[2], 2)
        self.layer4 = self._layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18():
    return ResNet(BasicBlock, [2, 2, 2, 2]), torch.randn(2, 3, 64, 64)


def resnet50():
    return ResNet(Bottleneck, [3, 4, 6, 3]), torch.randn(2, 3, 64, 64)


# --------------------------------------------------------------------------- transformers' eager models

def gpt2(attn="eager"):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=0,
                     eos_token_id=0, attn_implementation=attn)
    return GPT2LMHeadModel(cfg), torch.zeros(2, 32, dtype=torch.long)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128, attn_implementation="eager")
    return LlamaForCausalLM(cfg), torch.zeros(2, 32, dtype=torch.long)


def bert():
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=1000, max_position_embeddings=128, attn_implementation="eager")
    return BertForMaskedLM(cfg), torch.zeros(2, 32, dtype=torch.long)


def gpt2_sdpa():
    return gpt2("sdpa")


def torch_counts(factory):
    """(unique parameters, forward FLOPs by FlopCounterMode) of the model on CPU."""
    module, x = factory()
    if getattr(getattr(module, "config", None), "use_cache", None):
        module.config.use_cache = False
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module.eval()(x)
    return sum(p.numel() for p in module.parameters()), counter.get_total_flops()


def cli_import(name, tmp_path):
    """The model file ``soapbox import --torch this_module:name`` writes."""
    out = tmp_path / f"{name}.json"
    assert main(["import", "--torch", f"{__name__}:{name}", "-o", str(out)]) == 0
    return load_model(str(out))


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "gpt2", "llama"])
def test_parameters_and_gemm_flops_equal_torchs(name, tmp_path, capsys):
    g = cli_import(name, tmp_path)
    assert "they differ" not in capsys.readouterr().out
    params, flops = torch_counts(globals()[name])
    assert g.param_count == params
    assert sum(o.fwd_flops for o in g.ops if o.kind in GEMM_KINDS) == flops


def test_bert_tied_decoder_and_its_tables(tmp_path, capsys):
    """BERT's masked-LM decoder shares the token table (counted once) and has a bias of its own
    (a ``bias`` op beside the tied linear); the position and token-type tables, looked up by
    constant ids, are kept: parameters equal torch's."""
    g = cli_import("bert", tmp_path)
    assert "they differ" not in capsys.readouterr().out
    params, flops = torch_counts(bert)
    assert g.param_count == params
    assert sum(o.fwd_flops for o in g.ops if o.kind in GEMM_KINDS) == flops
    tables = sorted(o.params[0].shape for o in g.ops if o.kind == "embedding")
    assert tables == [(2, 64), (128, 64), (1000, 64)]
    head, bias = g.ops[-2:]
    assert (head.kind, head.param_group, bias.kind, bias.params[0].shape) == \
        ("linear", "bert.embeddings.word_embeddings.weight", "bias", (1000,))


def test_resnets_in_place_relus_and_residual_adds():
    g, _ = import_torch(resnet18)
    kinds = [o.kind for o in g.ops]
    assert kinds.count("conv2d") == 20 and kinds.count("relu") == 17 and kinds.count("add") == 8
    assert kinds.count("batchnorm") == 20 and "elementwise" not in kinds


def test_gpt2_tied_lm_head_and_position_table():
    g, _ = import_torch(gpt2)
    emb = [o for o in g.ops if o.kind == "embedding"]
    head = g.ops[-1]
    assert head.kind == "linear" and head.param_group == emb[0].param_group == "transformer.wte.weight"
    # the position table (looked up by arange) stays a parameter, its ids one row per sample
    assert emb[1].params[0].shape == (128, 64) and emb[1].in_tensors[0].shape == (2, 32)
    assert g.param_count == sum(p.numel() for p in gpt2()[0].parameters()) == 172_288


def test_llama_rmsnorm_and_grouped_query_heads():
    g, _ = import_torch(llama)
    kinds = [o.kind for o in g.ops]
    assert kinds.count("rmsnorm") == 5 and kinds.count("broadcast") == 4  # (2 layers x k, v repeated)
    assert kinds.count("linear") == 15 and kinds.count("batch_matmul") == 4


def test_sdpa_with_a_mask_counts_every_score_and_is_causal_half():
    """transformers' sdpa GPT-2 passes its causal mask as ``attn_mask``: PyTorch's masked kernels
    compute every score, so the import is a non-causal ``attention`` counted in full, equal to
    the eager GPT-2's count. (FlopCounterMode counts nothing for sdpa on CPU, whose fused kernel
    it does not know; on the meta device sdpa decomposes into two bmm and is counted in full.)
    With ``is_causal=True`` soapbox's attention skips the masked half (FlashAttention) while
    FlopCounterMode counts the whole S x S matrix: soapbox's attention is half of torch's."""
    g, _ = import_torch(gpt2_sdpa)
    att = [o for o in g.ops if o.kind == "attention"]
    assert len(att) == 2 and not any(o.attrs["causal"] for o in att)
    assert sum(o.fwd_flops for o in g.ops if o.kind in GEMM_KINDS) == torch_counts(gpt2)[1]

    class Causal(nn.Module):
        def forward(self, q):
            return nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    def causal():
        return Causal(), torch.randn(2, 4, 32, 16)

    g, _ = import_torch(causal)
    att = [o for o in g.ops if o.kind == "attention"]
    assert len(att) == 1 and att[0].attrs["causal"]
    q = torch.randn(2, 4, 32, 16, device="meta")
    with FlopCounterMode(display=False) as counter:
        Causal()(q)
    assert 2 * att[0].fwd_flops == counter.get_total_flops() == 2 * 2 * (2 * 4 * 32 * 32 * 16)


class Unmapped(nn.Module):
    def forward(self, x):
        y = torch.cumsum(torch.relu_(x), dim=-1)
        y = torch.flip(y, dims=[-1]) * 2
        return torch.cumsum(y, dim=-1) + y


def test_a_refusal_lists_every_unmapped_call_with_counts():
    """Regression: the calls after the first unmapped one were folded as constants, so one was
    listed where three are unmapped."""
    with pytest.raises(ValidationError, match=r"3 ATen call\(s\) soapbox cannot map: cumsum x 2 \(e\.g\. cumsum, "
                                              r"cumsum_1\); flip x 1"):
        import_torch(lambda: (Unmapped(), torch.randn(4, 8)))
    g, notes = import_torch(lambda: (Unmapped(), torch.randn(4, 8)), unknown="elementwise")
    assert [o.kind for o in g.ops] == ["input", "relu", "elementwise", "elementwise", "elementwise", "elementwise",
                                       "add"]


def test_in_place_variants_map_as_their_out_of_place_ops():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = nn.Linear(8, 8), nn.ReLU6(inplace=True)

        def forward(self, x):
            y = self.act(self.fc(x))
            y.mul_(x)
            return y.add_(x)

    g, _ = import_torch(lambda: (InPlace(), torch.randn(4, 8)))
    assert [o.kind for o in g.ops] == ["input", "linear", "elementwise", "mul", "add"]
    assert g.ops[2].attrs["label"] == "hardtanh"


def test_numbered_modules_become_layer_blocks_that_pipelines_split():
    """Issue 44: imported models had no layer blocks, so no pipeline layouts. The outermost
    numbered module on each call's nn_module_stack is its block (LLaMA's ``model.layers.N``);
    the embedding and the head stay outside, and a two-stage pipeline builds and simulates."""
    from engine.cluster import preset
    from engine.graph.blocks import layer_blocks
    from engine.layout import Layout
    from engine.layout.build import build_layout
    from engine.sim.report import simulate_strategy

    g, _ = import_torch(llama)
    blocks = layer_blocks(g)
    assert len(blocks) >= 2 and all(b.rsplit(".", 1)[-1].isdigit() and ".layers." in b for b in blocks)
    assert next(op for op in g.ops if op.kind == "embedding").block is None
    c = preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(pp=2, dp=1, micro_batch=1))
    assert s.pipeline.stages == 2 and simulate_strategy(g, s, c).iteration_time_s > 0
