"""Tiny random configs of many transformers architectures, for the architecture sweep.

Every model: 2 layers, hidden size 32, 4 query heads of dim 8 (2 key/value heads where the
architecture has grouped-query attention), float32, eval mode, seeded, init range 0.15 (so that
attention is not uniform), and every linear bias (and learned sink logit) re-drawn at random so
that b_V and b_O are nonzero wherever the architecture has them. Quirks are set so that they bite
on 12 tokens: sliding windows of 4-6, soft-capping at 2, a Granite multiplier of 0.2, MLA with a
value head dim of 6 against a query head dim of 12.

``ARCHS[name].w_o`` names the output projection for the independent reference
(``tests/reference.py: eager_measure``), relative to the module that calls attention ("^" = its
parent); ``refused`` is a piece of the one-line reason a refused architecture must give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

import tiny_models as tm

SEQ_LEN, BATCH = 12, 3
IMAGE = 12


@dataclass(frozen=True)
class Arch:
    kind: str                              # decoder | encoder | vision
    config: dict = field(default_factory=dict)
    w_o: str = "o_proj"
    refused: str | None = None
    model_type: str | None = None          # when the entry name is not the model_type
    model_class: str | None = None         # a transformers class instead of the Auto one


DECODER = dict(vocab_size=tm.VOCAB_SIZE, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               max_position_embeddings=128, initializer_range=tm.INIT_RANGE,
               pad_token_id=tm.PAD_ID, bos_token_id=tm.BOS_ID, eos_token_id=tm.EOS_ID,
               tie_word_embeddings=False)
ENCODER = dict(vocab_size=tm.VOCAB_SIZE, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
               initializer_range=tm.INIT_RANGE, pad_token_id=tm.PAD_ID,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              image_size=IMAGE, patch_size=4, num_channels=3, initializer_range=tm.INIT_RANGE)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
WINDOW2 = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])
NOT_HOOKED = "without transformers' attention interface"

ARCHS: dict[str, Arch] = {
    # ------------------------------------------------------------------ decoders
    "llama": Arch("decoder"),
    "mistral": Arch("decoder", dict(sliding_window=6)),
    "mixtral": Arch("decoder", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": Arch("decoder", dict(use_sliding_window=False)),
    "qwen2_moe": Arch("decoder", dict(MOE, shared_expert_intermediate_size=16)),
    "qwen3": Arch("decoder"),
    "qwen3_moe": Arch("decoder", MOE),
    "gemma": Arch("decoder"),
    "gemma2": Arch("decoder", dict(WINDOW2, attn_logit_softcapping=2.0,
                                   query_pre_attn_scalar=16)),
    "gemma3_text": Arch("decoder", dict(WINDOW2, query_pre_attn_scalar=16)),
    "gpt2": Arch("decoder", dict(n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
                 w_o="c_proj"),
    "gpt_neox": Arch("decoder", dict(rotary_pct=0.5), w_o="dense"),
    "gptj": Arch("decoder", dict(n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                 rotary_dim=4), w_o="out_proj"),
    "gpt_bigcode": Arch("decoder", dict(n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                        multi_query=True), w_o="c_proj"),
    "opt": Arch("decoder", dict(ffn_dim=64, word_embed_proj_dim=32, enable_bias=True),
                w_o="out_proj"),
    "phi": Arch("decoder", dict(partial_rotary_factor=0.5), w_o="dense"),
    "phi3": Arch("decoder"),
    "olmo": Arch("decoder"),
    "olmo2": Arch("decoder"),
    "olmoe": Arch("decoder", dict(num_experts=4, num_experts_per_tok=2)),
    "starcoder2": Arch("decoder", dict(sliding_window=5, use_bias=True)),
    "stablelm": Arch("decoder", dict(use_qkv_bias=True, partial_rotary_factor=0.5)),
    "cohere": Arch("decoder", dict(use_qk_norm=True)),
    "cohere2": Arch("decoder", WINDOW2),
    "granite": Arch("decoder", dict(attention_multiplier=0.2)),
    "granitemoe": Arch("decoder", dict(attention_multiplier=0.2, num_local_experts=4,
                                       num_experts_per_tok=2)),
    "deepseek_v3": Arch("decoder", dict(
        num_key_value_heads=4, head_dim=None, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6, n_routed_experts=4,
        num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=16,
        first_k_dense_replace=1)),
    "gpt_oss": Arch("decoder", dict(WINDOW2, num_local_experts=4, num_experts_per_tok=2,
                                    attention_bias=True)),
    "persimmon": Arch("decoder", dict(num_key_value_heads=None, head_dim=None), w_o="dense"),
    "smollm3": Arch("decoder"),
    "llama4_text": Arch("decoder", dict(num_local_experts=2, intermediate_size_mlp=64,
                                        attention_chunk_size=5)),
    "internlm3": Arch("decoder", dict(bias=True, qkv_bias=True)),
    "exaone4": Arch("decoder", WINDOW2),
    "olmo3": Arch("decoder", WINDOW2),
    "vaultgemma": Arch("decoder", dict(WINDOW2, attn_logit_softcapping=2.0,
                                       query_pre_attn_scalar=16)),
    "falcon": Arch("decoder", dict(head_dim=None), w_o="dense"),   # rotary; ALiBi is refused
    # ------------------------------------------------------------------ encoders
    "bert": Arch("encoder", w_o="^output.dense"),
    "roberta": Arch("encoder", w_o="^output.dense"),
    "xlm-roberta": Arch("encoder", w_o="^output.dense"),
    "electra": Arch("encoder", dict(embedding_size=32), w_o="^output.dense"),
    "distilbert": Arch("encoder", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                       dropout=0.0, attention_dropout=0.0), w_o="out_lin"),
    "modernbert": Arch("encoder", dict(local_attention=4, global_attn_every_n_layers=2,
                                       attention_bias=True), w_o="Wo"),
    "albert": Arch("encoder", dict(embedding_size=32), w_o="dense"),
    # ------------------------------------------------------------------ vision
    "vit": Arch("vision"),
    "deit": Arch("vision"),
    "dinov2": Arch("vision"),
    "dinov2_with_registers": Arch("vision", dict(num_register_tokens=2)),
    "clip_vision_model": Arch("vision", w_o="out_proj"),
    "siglip_vision_model": Arch("vision", w_o="out_proj"),
    # ------------------------------------------------------------------ refused
    "bloom": Arch("decoder", dict(n_layer=2, n_head=4), refused=NOT_HOOKED),
    "mpt": Arch("decoder", dict(d_model=32, n_heads=4, n_layers=2), refused=NOT_HOOKED),
    "gpt_neo": Arch("decoder", dict(num_layers=2, attention_types=[[["global", "local"], 1]],
                                    window_size=4), refused=NOT_HOOKED),
    "xglm": Arch("decoder", dict(d_model=32, num_layers=2, ffn_dim=64), refused=NOT_HOOKED),
    "bitnet": Arch("decoder", refused="goes through model.layers.0.self_attn.attn_sub_norm"),
    "diffllama": Arch("decoder", refused="differential attention"),
    "jetmoe": Arch("decoder", dict(kv_channels=8, num_local_experts=4, num_experts_per_tok=2),
                   refused="JetMoeAttention: the attention output is changed"),
    "qwen3_next": Arch("decoder", dict(layer_types=["linear_attention", "full_attention"]),
                       refused="Qwen3NextAttention: the attention output is changed"),
    "doge": Arch("decoder", refused="adds a bias to the attention logits through its mask"),
    "t5": Arch("decoder", dict(d_model=32, d_kv=8, num_heads=4, num_layers=2, d_ff=64),
               refused="encoder-decoder"),
    "t5-encoder": Arch("encoder", dict(d_model=32, d_kv=8, num_heads=4, num_layers=2, d_ff=64),
                       model_type="t5", model_class="T5EncoderModel",
                       refused="passes position_bias="),
    "deberta-v2": Arch("encoder", refused=NOT_HOOKED),
}
SUPPORTED = [n for n, a in ARCHS.items() if a.refused is None]
REFUSED = [n for n, a in ARCHS.items() if a.refused is not None]


def make_config(name: str):
    """The tiny transformers config of entry ``name``."""
    from transformers import AutoConfig

    arch = ARCHS[name]
    base = {"decoder": DECODER, "encoder": ENCODER, "vision": VISION}[arch.kind]
    kw = {**base, **arch.config}
    kw = {k: v for k, v in kw.items() if v is not None}
    return AutoConfig.for_model(arch.model_type or name, **kw)


def _model_class(name: str, config):
    import transformers as tf

    arch = ARCHS[name]
    if arch.model_class:
        return getattr(tf, arch.model_class)
    if arch.kind == "decoder":
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
        if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
            return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    from transformers.models.auto.modeling_auto import MODEL_MAPPING
    return MODEL_MAPPING[type(config)]


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of entry ``name``: float32, eval mode, deterministic for ``seed``."""
    config = make_config(name)
    torch.manual_seed(seed)
    model = _model_class(name, config)._from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "bias", None)
            if isinstance(bias, torch.nn.Parameter) and hasattr(module, "weight") \
                    and bias.dim() == 1 and module.weight.dim() == 2:
                bias.copy_(torch.randn(bias.shape, generator=gen) * 0.2)
            sinks = getattr(module, "sinks", None)
            if isinstance(sinks, torch.nn.Parameter):
                sinks.copy_(torch.randn(sinks.shape, generator=gen))
    model.config.architectures = [type(model).__name__]
    return model.float().eval()


def inputs(name: str, batch: int = BATCH, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded token ids (lengths 12, 9, 6; BOS first) or ``batch`` random images."""
    gen = torch.Generator().manual_seed(seed)
    if ARCHS[name].kind == "vision":
        return {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE, generator=gen)}
    ids = torch.randint(tm.N_SPECIAL, tm.VOCAB_SIZE, (batch, SEQ_LEN), generator=gen)
    mask = torch.zeros(batch, SEQ_LEN, dtype=torch.long)
    for b, n in enumerate(tm.sequence_lengths(batch, SEQ_LEN)):
        mask[b, :n] = 1
        ids[b, n:] = tm.PAD_ID
        ids[b, 0] = tm.BOS_ID
        if ARCHS[name].kind == "encoder":
            ids[b, n - 1] = tm.EOS_ID
    return {"input_ids": ids, "attention_mask": mask}


def save(name: str, directory: str | Path, seed: int = 0) -> Path:
    """Save entry ``name`` with a tokenizer (text) or a 12x12 image processor (vision)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build(name, seed).save_pretrained(directory)
    kind = ARCHS[name].kind
    proc = tm.make_image_processor() if kind == "vision" else tm.make_tokenizer(
        "bert" if kind == "encoder" else "llama")
    proc.save_pretrained(directory)
    return directory
