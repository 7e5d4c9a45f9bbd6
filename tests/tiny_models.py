"""Tiny random-init Hugging Face models for tests (no hub access needed).

Every model is float32, in eval mode, seeded, 2 layers, hidden size 32-48, head_dim 8-16.
Weights use a larger init range than Hugging Face's default (0.02) so attention is not
near-uniform and value geometry actually varies between tokens.

Quirks built in on purpose:
- llama: grouped-query attention (4 query heads, 2 kv heads).
- mistral: ``sliding_window=6`` on every layer (as Mistral-7B-v0.1 has one), so it bites at T=12.
- qwen2: q/k/v biases re-initialised randomly (nonzero value bias b_V), no o_proj bias.
- qwen3: q_norm/k_norm on q and k (v is plain ``v_proj(x)``).
- gemma3: ``Gemma3ForCausalLM`` text-only; layer 0 sliding (window 4: key j visible to
  query i iff i - 4 < j <= i), layer 1 full attention.
- gpt2: Conv1D projections (weight layout (in, out)), output bias.
- bert: ``BertModel`` encoder, bidirectional, key padding mask only, output bias.
- vit: ``ViTModel`` on 12x12 pixels with 4x4 patches -> 9 patches + CLS = 10 tokens, no padding.
"""

from __future__ import annotations

from pathlib import Path

import torch

ARCHITECTURES: list[str] = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt2", "bert", "vit"]
DECODERS: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt2")

VOCAB_SIZE = 64
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
N_SPECIAL = 4
INIT_RANGE = 0.15
IMAGE_SIZE, PATCH_SIZE = 12, 4

_WORDS = (
    "the a an of to and in is it that was for on are as with his they at be this from have or by "
    "one had not but what all were when we there can said which do their if will up other about "
    "out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people"
).split()


def _llama_like_kwargs() -> dict:
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        initializer_range=INIT_RANGE, pad_token_id=PAD_ID, bos_token_id=BOS_ID,
        eos_token_id=EOS_ID, tie_word_embeddings=False,
    )


def make_config(arch: str):
    """Return the tiny transformers config for ``arch`` (one of ``ARCHITECTURES``)."""
    import transformers as tf

    if arch == "llama":
        return tf.LlamaConfig(**_llama_like_kwargs())
    if arch == "mistral":
        return tf.MistralConfig(**_llama_like_kwargs(), sliding_window=6)
    if arch == "qwen2":
        return tf.Qwen2Config(**_llama_like_kwargs())
    if arch == "qwen3":
        return tf.Qwen3Config(**_llama_like_kwargs())
    if arch == "gemma3":
        kw = _llama_like_kwargs()
        kw.update(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=96, query_pre_attn_scalar=16, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True)
        return tf.Gemma3TextConfig(**kw)
    if arch == "gpt2":
        return tf.GPT2Config(
            vocab_size=VOCAB_SIZE, n_positions=128, n_embd=32, n_layer=2, n_head=4,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=INIT_RANGE,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        )
    if arch == "bert":
        return tf.BertConfig(
            vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, initializer_range=INIT_RANGE, pad_token_id=PAD_ID,
        )
    if arch == "vit":
        return tf.ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, num_channels=3,
            initializer_range=INIT_RANGE, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {ARCHITECTURES}")


def _model_class(arch: str):
    import transformers as tf

    return {
        "llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM,
        "qwen2": tf.Qwen2ForCausalLM, "qwen3": tf.Qwen3ForCausalLM,
        "gemma3": tf.Gemma3ForCausalLM, "gpt2": tf.GPT2LMHeadModel,
        "bert": tf.BertModel, "vit": tf.ViTModel,
    }[arch]


def build(arch: str, seed: int = 0, attn_implementation: str | None = None) -> torch.nn.Module:
    """Build a tiny random-init model: float32, eval mode, deterministic for ``seed``.

    ``attn_implementation`` ("eager", "sdpa", ...) is passed to ``from_config``; None lets
    transformers choose its default.
    """
    config = make_config(arch)
    torch.manual_seed(seed)
    kwargs = {"dtype": torch.float32}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = _model_class(arch)._from_config(config, **kwargs)
    if arch == "qwen2":
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for mod in model.modules():
                for name in ("q_proj", "k_proj", "v_proj"):
                    lin = getattr(mod, name, None)
                    if isinstance(lin, torch.nn.Linear) and lin.bias is not None:
                        lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen) * 0.2)
    return model.float().eval()


def sequence_lengths(batch: int, seq_len: int) -> list[int]:
    """Valid lengths used by ``example_inputs``: the first full, each later one 3 shorter (>= 2)."""
    return [max(2, seq_len - 3 * b) for b in range(batch)]


def example_inputs(arch: str, model: torch.nn.Module | None = None, batch: int = 2,
                   seq_len: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Model inputs: ``input_ids`` + ``attention_mask`` (right padding) or ``pixel_values``.

    Text: position 0 is BOS (CLS for bert); bert sequences end with SEP; padding uses
    ``PAD_ID`` and ``attention_mask`` 0. For vit, ``seq_len`` is ignored (10 tokens).
    """
    gen = torch.Generator().manual_seed(seed)
    if arch == "vit":
        return {"pixel_values": torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen)}
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {ARCHITECTURES}")
    ids = torch.randint(N_SPECIAL, VOCAB_SIZE, (batch, seq_len), generator=gen)
    mask = torch.zeros(batch, seq_len, dtype=torch.long)
    for b, n in enumerate(sequence_lengths(batch, seq_len)):
        mask[b, :n] = 1
        ids[b, n:] = PAD_ID
        ids[b, 0] = BOS_ID
        if arch == "bert":
            ids[b, n - 1] = EOS_ID
    return {"input_ids": ids, "attention_mask": mask}


def make_tokenizer(arch: str):
    """A tiny word-level ``PreTrainedTokenizerFast`` matching the tiny models' vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if arch == "vit":
        raise ValueError("vit takes pixels, not text; use make_image_processor()")
    bert = arch == "bert"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] if bert else ["<pad>", "<unk>", "<bos>", "<eos>"]
    words = _WORDS[: VOCAB_SIZE - N_SPECIAL]
    vocab = {tok: i for i, tok in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials[UNK_ID]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", BOS_ID), ("[SEP]", EOS_ID)])
        names = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", BOS_ID)])
        names = dict(pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")
    return PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="right", **names)


def make_image_processor():
    """A ``ViTImageProcessor`` sized for the tiny vit (12x12)."""
    from transformers import ViTImageProcessor

    return ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


def save_tiny(arch: str, directory: str | Path, seed: int = 0) -> Path:
    """Save a tiny model plus its tokenizer (image processor for vit) to ``directory``.

    The directory loads back with ``AutoModel*.from_pretrained`` / ``AutoTokenizer``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build(arch, seed=seed).save_pretrained(directory)
    proc = make_image_processor() if arch == "vit" else make_tokenizer(arch)
    proc.save_pretrained(directory)
    return directory
