"""Discovery and its refusals in detail: keywords refused by name, head counts that vary, the
probe's checks on W_O and eager attention, the Auto class, image data and token names.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

import tiny_archs as ta
import tiny_models as tm
from attngeom.extract.measurement import hooks
from attngeom.extract.measurement.archs import Unsupported, discover
from attngeom.extract.loading.images import is_image_spec, load_images, token_names


class _Module(torch.nn.Module):
    pass


@pytest.mark.parametrize("kwargs,reason", [
    ({"position_bias": torch.zeros(1)}, "position_bias= to attention: relative position"),
    ({"indices": torch.zeros(1)}, "indices= to attention: sparse attention"),
    ({"block_indices": torch.zeros(1)}, "block-sparse"),
    ({"head_mask": torch.ones(1)}, "head mask"),
    ({"encoder_hidden_states": torch.ones(1)}, "cross-attention"),
    ({"alibi": torch.ones(1)}, "the attention keyword 'alibi'"),
    ({"dropout": 0.1}, "training mode"),
])
def test_keywords_refused_by_name(kwargs, reason):
    with pytest.raises(ValueError, match=reason) as info:
        hooks.attention_keywords(_Module(), {"scaling": 0.1, **kwargs})
    assert "\n" not in str(info.value) and "_Module" in str(info.value)


def test_harmless_keywords_pass():
    hooks.attention_keywords(_Module(), {
        "scaling": 0.1, "dropout": 0.0, "sliding_window": 4, "position_ids": torch.zeros(1),
        "use_cache": False, "softcap": 2.0, "s_aux": torch.zeros(4), "position_bias": None,
        "encoder_hidden_states": None})


def test_additive_mask_values_refused():
    mask = torch.zeros(1, 1, 2, 2)
    mask[..., 0, 1] = torch.finfo(torch.float32).min
    hooks._check_mask(_Module(), mask)                        # 0 / min: a plain mask
    mask[..., 1, 0] = -0.5                                    # a bias (ALiBi-like)
    with pytest.raises(Unsupported, match="adds a bias"):
        hooks._check_mask(_Module(), mask)


def test_layers_with_different_head_counts_are_refused():
    from transformers.models.llama.modeling_llama import LlamaAttention

    model = tm.build("llama")
    cfg = model.config.__class__(**{**model.config.to_dict(), "num_attention_heads": 2,
                                    "num_key_value_heads": 2})
    cfg._attn_implementation = model.config._attn_implementation
    model.model.layers[1].self_attn = LlamaAttention(cfg, layer_idx=1).eval()
    with pytest.raises(Unsupported, match=r"different head counts \(2 query/2 kv, 4 query/2 kv\)"):
        discover(model)


def test_a_projection_that_is_not_z_times_w_is_refused():
    """A linear layer that receives z but computes something else (here: scaled output)."""
    model = tm.build("llama")
    o_proj = model.model.layers[0].self_attn.o_proj
    o_proj.register_forward_hook(lambda m, a, out: out * 2.0)
    with pytest.raises(Unsupported, match=r"o_proj \(Linear\) receives the attention output but "
                                          "does not compute z @ W_O"):
        discover(model)


def test_an_attention_that_differs_from_eager_is_refused(monkeypatch):
    """The probe compares attngeom's attention with the modelling file's eager attention."""
    import transformers.models.llama.modeling_llama as ml

    model = tm.build("llama")
    original = ml.eager_attention_forward

    def skewed(module, query, key, value, mask, **kw):
        out, w = original(module, query * 1.5, key, value, mask, **kw)
        return out, w

    monkeypatch.setattr(ml, "eager_attention_forward", skewed)
    with pytest.raises(Unsupported, match="differs from the model's own eager attention"):
        discover(model)


def test_discovery_finds_the_layout():
    arch = discover(ta.build("deepseek_v3"))
    first = arch.layers[0]
    assert (first.n_heads, first.n_kv_heads, first.head_dim, first.value_dim) == (4, 4, 12, 6)
    assert arch.causal and arch.inputs == "text" and "MLA (value head dim differs)" in arch.notes
    bert = discover(ta.build("bert"))
    assert not bert.causal and bert.layers[0].out_name.endswith("attention.output.dense")
    albert = discover(ta.build("albert"))
    assert albert.layers[0].module is albert.layers[1].module          # one shared layer


def test_auto_class_follows_the_checkpoint():
    from transformers import BertConfig, LlamaConfig

    from attngeom.extract.loading.models import auto_class

    assert auto_class(LlamaConfig(architectures=["LlamaForCausalLM"])) == "AutoModelForCausalLM"
    assert auto_class(BertConfig(architectures=["BertModel"])) == "AutoModel"
    assert auto_class(BertConfig(architectures=["BertForMaskedLM"])) == "AutoModel"
    assert auto_class(BertConfig(architectures=["BertLMHeadModel"])) == "AutoModelForCausalLM"
    assert auto_class(LlamaConfig()) == "AutoModel"


# ------------------------------------------------------------------------------------ images
def _png(path, h, w, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)


def test_image_folder(tmp_path):
    for name in ("b.png", "a.jpg", "c.JPEG"):
        _png(tmp_path / name, 8, 8) if not name.endswith("jpg") else _png(tmp_path / name, 5, 9)
    (tmp_path / "notes.txt").write_text("not an image")
    images = load_images(str(tmp_path))
    assert images.names == ["a.jpg", "b.png", "c.JPEG"] and len(images) == 3
    assert load_images(str(tmp_path), limit=2).names == ["a.jpg", "b.png"]
    assert load_images(str(tmp_path)).sha256 == images.sha256
    _png(tmp_path / "b.png", 8, 8, seed=1)
    assert load_images(str(tmp_path)).sha256 != images.sha256          # content, not names
    assert is_image_spec(str(tmp_path)) and not is_image_spec("hf:x:test")
    assert is_image_spec("hf:x:test", "image")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no .png/.jpg/.jpeg image"):
        load_images(str(empty))


def test_image_dataset_field(monkeypatch):
    from PIL import Image

    rows = [{"label": i, "img": Image.new("RGB", (6, 6), (i, 0, 0))} for i in range(3)]
    fake = types.SimpleNamespace(load_dataset=lambda name, config, split: rows)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    images = load_images("hf:someone/pictures:test", image_field="img")
    assert images.names == ["row 1", "row 2", "row 3"]
    assert images.texts[2].getpixel((0, 0)) == (2, 0, 0)
    assert load_images("hf:someone/pictures:test").names == images.names   # found by type
    with pytest.raises(ValueError, match="no image field label.*--image-field"):
        load_images("hf:someone/pictures:test", image_field="label")


@pytest.mark.parametrize("name,first", [
    ("vit", ["[CLS]", "p(0,0)"]), ("deit", ["[CLS]", "[DIST]", "p(0,0)"]),
    ("dinov2_with_registers", ["[CLS]", "reg0", "reg1", "p(0,0)"]),
    ("clip_vision_model", ["[CLS]", "p(0,0)"]), ("siglip_vision_model", ["p(0,0)", "p(0,1)"])])
def test_vision_token_names(name, first):
    model = ta.build(name)
    layer = discover(model).layers[0]
    with torch.no_grad():
        seen = []
        handle = layer.module.register_forward_pre_hook(
            lambda m, a, k: seen.append((a[0] if a else k["hidden_states"]).shape[1]),
            with_kwargs=True)
        model(**ta.inputs(name, batch=1))
        handle.remove()
    names = token_names(model, seen[0], ta.IMAGE, ta.IMAGE)
    assert names[:len(first)] == first and names[-1] == "p(2,2)" and len(names) == seen[0]
    with pytest.raises(ValueError, match="drops patches"):
        token_names(model, 5, ta.IMAGE, ta.IMAGE)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_measured_pass_never_reads_the_lm_head(arch):
    """Discovery's probe and the measured pass run the decoder stack alone: the LM head's
    (vocabulary x d) weight, tied to the embeddings, is never multiplied (a whole-model
    forward would read all of it for even one position's logits)."""
    from attngeom.extract.measurement.capture import capture

    model = tm.build(arch)
    called = []
    model.get_output_embeddings().register_forward_hook(lambda *a: called.append(1))
    discover(model)
    capture(model, tm.example_inputs(arch, model))
    assert called == []
