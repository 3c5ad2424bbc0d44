"""Loading a CSM checkpoint (with its Mimi codec and text tokenizer), or building one.

A real checkpoint is a directory or hub id that `CsmForConditionalGeneration.from_pretrained`
and `AutoTokenizer.from_pretrained` read (sesame/csm-1b holds both, the codec inside the
model). A random-weight model is built from the sizes in `CodecLMConfig` with a byte-level
text tokenizer made here, saved with `save_pretrained` into the cache directory, and loaded
back through the same `from_pretrained` calls; `save_random: false` skips the disk round
trip (the full-size random model on a GPU).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.config import CodecLMConfig

logger = logging.getLogger("playhead.codec_lm")

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|pad|>"
_SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
_BUILD_VERSION = 2  # bump when the random build changes, so caches are rebuilt


@dataclass
class LoadedModel:
    model: Any  # CsmForConditionalGeneration, eval mode, on `device` in `dtype`
    tokenizer: Any  # a transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    source: str  # the checkpoint path or hub id, or "random:<digest>"


def resolve_device(config: CodecLMConfig) -> tuple[torch.device, torch.dtype]:
    """The device and dtype the config asks for (auto: cuda + bfloat16 when there is a GPU)."""
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, config.dtype)
    return device, dtype


def _csm_config(config: CodecLMConfig) -> Any:
    from transformers import CsmConfig

    text_ids = config.text_vocab_size
    codec = {
        "model_type": "mimi",
        "hidden_size": config.codec_hidden_size,
        "num_filters": config.codec_filters,
        "codebook_size": config.codec_codebook_size,
        "codebook_dim": config.codec_codebook_dim,
        "vector_quantization_hidden_dimension": config.codec_codebook_dim,
        "num_quantizers": config.num_codebooks,
        "upsample_groups": config.codec_hidden_size,
        "num_hidden_layers": config.codec_layers,
        "intermediate_size": config.codec_intermediate_size,
        "num_attention_heads": config.codec_heads,
        "num_key_value_heads": config.codec_heads,
    }
    depth = {
        "num_codebooks": config.num_codebooks,
        "backbone_hidden_size": config.backbone_hidden_size,
        "vocab_size": config.codebook_size,
        "hidden_size": config.depth_hidden_size,
        "intermediate_size": config.depth_intermediate_size,
        "num_hidden_layers": config.depth_layers,
        "num_attention_heads": config.depth_heads,
        "num_key_value_heads": config.depth_kv_heads,
        "max_position_embeddings": config.num_codebooks + 1,
    }
    # the byte tokenizer's ids: 256 bytes, then bos, eos, pad
    return CsmConfig(
        num_codebooks=config.num_codebooks,
        vocab_size=config.codebook_size,
        text_vocab_size=text_ids,
        hidden_size=config.backbone_hidden_size,
        intermediate_size=config.backbone_intermediate_size,
        num_hidden_layers=config.backbone_layers,
        num_attention_heads=config.backbone_heads,
        num_key_value_heads=config.backbone_kv_heads,
        max_position_embeddings=max(2048, config.max_prompt_tokens + config.max_frames_per_segment),
        bos_token_id=256,
        pad_token_id=258,
        audio_token_id=258,
        audio_eos_token_id=257,
        codebook_pad_token_id=config.codebook_size - 1,
        codebook_eos_token_id=0,
        depth_decoder_config=depth,
        codec_config=codec,
    )


def build_byte_tokenizer() -> Any:
    """A byte-level tokenizer (one id per UTF-8 byte, then bos/eos/pad), built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )


def _byte_of(char: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's bytes_to_unicode)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    code = ord(char)
    if code in printable:
        return code
    missing = [b for b in range(256) if b not in printable]
    return missing[code - 256]


def random_model_digest(config: CodecLMConfig) -> str:
    """Names a random build: the sizes, the seed and the build version."""
    fields = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.name.startswith(("num_", "codebook_", "text_", "backbone_", "depth_", "codec_"))
        or f.name in ("seed", "max_prompt_tokens", "max_frames_per_segment")
    }
    fields["version"] = _BUILD_VERSION
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "playhead" / "codec-lm"


def _build_random(config: CodecLMConfig, device: torch.device) -> tuple[Any, Any]:
    from transformers import CsmForConditionalGeneration

    if config.text_vocab_size < 259:
        raise ValueError("text_vocab_size must be >= 259 for the byte tokenizer")
    torch.manual_seed(config.seed)
    with torch.device(device):
        model = CsmForConditionalGeneration(_csm_config(config))
    _randomize_codebooks(model.codec_model)
    return model.eval(), build_byte_tokenizer()


def _randomize_codebooks(codec: torch.nn.Module) -> None:
    """Mimi initialises its codebooks to zeros (they are learned as running sums), which
    would make every code decode alike: give a random model random centroids instead."""
    with torch.no_grad():
        for module in codec.modules():
            if hasattr(module, "embed_sum") and hasattr(module, "cluster_usage"):
                module.embed_sum.normal_()
                module.cluster_usage.fill_(1.0)
                module._embed = None


def random_model_path(config: CodecLMConfig) -> Path:
    """The directory holding the saved random model (built and saved if missing)."""
    root = Path(config.cache_dir) if config.cache_dir else _default_cache_dir()
    path = root / f"random-{random_model_digest(config)}"
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    logger.info("building a random-weight CSM + Mimi into %s", path)
    model, tokenizer = _build_random(config, torch.device("cpu"))
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(path)
        except OSError:  # built by another process meanwhile: keep theirs
            if not (path / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def cast_codec(codec: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Mimi in `dtype`, its codebooks' cached embeddings dropped (rebuilt in that dtype)."""
    codec.to(dtype=dtype)
    for module in codec.modules():
        if hasattr(module, "embed_sum") and hasattr(module, "_embed"):
            module._embed = None
    return codec


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """from_pretrained's dtype argument: `dtype` since transformers 4.56, `torch_dtype` before."""
    import transformers
    from packaging.version import Version

    new = Version(transformers.__version__).release >= (4, 56)
    return {"dtype" if new else "torch_dtype": dtype}


def load_model(config: CodecLMConfig) -> LoadedModel:
    """The model and tokenizer named by the config, on its device, in eval mode."""
    from transformers import AutoTokenizer, CsmForConditionalGeneration

    device, dtype = resolve_device(config)
    if device.type == "cpu" and config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    if config.model is None and not config.save_random:
        model, tokenizer = _build_random(config, device)
        source = f"random:{random_model_digest(config)}"
    else:
        path = str(random_model_path(config)) if config.model is None else config.model
        model = CsmForConditionalGeneration.from_pretrained(path, **_dtype_kwarg(dtype))
        tokenizer = AutoTokenizer.from_pretrained(path)
        source = path if config.model is not None else f"random:{Path(path).name}"
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    if config.mimi_dtype != "model":  # Mimi keeps its own precision (float32 by default)
        cast_codec(model.codec_model, getattr(torch, config.mimi_dtype))
    return LoadedModel(model=model, tokenizer=tokenizer, device=device, dtype=dtype, source=source)
