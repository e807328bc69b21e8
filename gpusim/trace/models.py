"""Transformer model descriptions (``workloads/models/*.yaml``): hyperparameters with their sources.

A model file names the layer count, widths and heads of a published model and where they come from.
:func:`load_model` validates it (a misspelled or missing field, or a count that is not a positive
whole number -- ``true`` included -- is an error naming the file and the field) and :func:`list_models` lists the known ones.  Extra folders can be searched by setting
``$GPUSIM_MODELS`` (``os.pathsep``-separated).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpusim.data_paths import data_root
from gpusim.errors import ConfigError

MODELS_ENV = "GPUSIM_MODELS"
DEFAULT_EXPERTS_PER_TOKEN = 2
"""Top-k of a mixture of experts whose file does not say (GShard's and Mixtral's 2)."""


class ModelConfig(BaseModel):
    """Hyperparameters of a transformer.

    Attributes
    ----------
    name
        Short name (the file's stem for presets).
    description
        One line.
    sources
        Where every number comes from.
    hidden
        Hidden size H (d_model).
    layers
        Transformer layers L.
    heads
        Attention heads.
    kv_heads
        Key/value heads (grouped-query or multi-query attention); default: ``heads``.
    d_head
        Values per attention head; default: ``hidden / heads`` (which must then be whole).  PaLM's
        48 heads of 256 make an attention width of 12288, not its d_model of 18432.
    ffn_hidden
        Intermediate size of the MLP (d_ff); default: 4 H.
    vocab
        Vocabulary size (embedding and output layer).
    seq_len
        Default sequence length.
    batch
        Default (global) batch size in sequences.
    activation
        ``gelu`` (two-matrix MLP) or ``swiglu`` (gated MLP: three matrices).
    norm
        ``layernorm`` or ``rmsnorm``.
    position
        ``learned`` (position embeddings added to the input, outside the layers) or ``rope``
        (rotary embeddings: each layer rotates its queries and keys, a per-row kernel forward and
        backward, :func:`gpusim.kernels.rowreduce.vllm_row_kernel`).
    fused_qkv
        Whether Q, K and V are one GEMM (Megatron) or three (BERT as in Table 4.3 of seeds/002).
    causal
        Whether a token attends only to the tokens before it (decoders such as GPT) or to the whole
        sequence (encoders such as BERT); fused attention skips the masked scores.
    bias
        Whether the linear layers and layer norms have biases (BERT, GPT) or not (Llama, PaLM).
    tied_embeddings
        Whether the output layer reuses the input embedding's table (BERT, GPT, PaLM) or has its
        own (Llama).
    experts
        Routed experts of every layer's mixture-of-experts MLP (Mixtral, Switch, GShard): each
        expert is an MLP of ``ffn_hidden`` features, and a router (a linear layer of ``experts``
        outputs, without bias) sends each token to ``experts_per_token`` of them.  ``None`` (the
        default): one dense MLP.
    experts_per_token
        Experts each token is routed to (top-k); at most ``experts``; only with ``experts``
        (default: :data:`DEFAULT_EXPERTS_PER_TOKEN`).
    shared_expert_ffn
        Features of the shared expert that every token of a mixture of experts passes through
        beside its routed ones, an MLP like theirs (DeepSeek-MoE, Qwen-MoE; several shared experts
        are one of their summed width); only with ``experts``.  ``None`` (the default): none.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    sources: list[str] = Field(default_factory=list)
    hidden: int = Field(gt=0)
    layers: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int | None = Field(default=None, gt=0)
    d_head: int | None = Field(default=None, gt=0)
    ffn_hidden: int | None = Field(default=None, gt=0)
    vocab: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    batch: int = Field(default=1, gt=0)
    activation: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rope"] = "learned"
    fused_qkv: bool = True
    causal: bool = True
    bias: bool = True
    tied_embeddings: bool = True
    experts: int | None = Field(default=None, ge=2)
    experts_per_token: int | None = Field(default=None, gt=0)
    shared_expert_ffn: int | None = Field(default=None, gt=0)

    @field_validator("hidden", "layers", "heads", "kv_heads", "d_head", "ffn_hidden", "vocab", "seq_len", "batch",
                     "experts", "experts_per_token", "shared_expert_ffn", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: object) -> object:
        """Reject ``true``/``false`` for a count (pydantic would read them as 1 and 0)."""
        if isinstance(value, bool):
            raise ValueError(f"must be a whole number, got {str(value).lower()}")
        return value

    @model_validator(mode="after")
    def _check_heads(self) -> ModelConfig:
        if self.d_head is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}), "
                             f"or d_head must give the values per head")
        if self.heads % self.key_value_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.key_value_heads})")
        if self.experts is None and self.experts_per_token is not None:
            raise ValueError("experts_per_token routes tokens in a mixture of experts; it needs experts")
        if self.experts is None and self.shared_expert_ffn is not None:
            raise ValueError("shared_expert_ffn is a mixture of experts' shared expert; it needs experts")
        if self.experts is not None and self.top_k > self.experts:
            raise ValueError(f"experts_per_token ({self.top_k}) exceeds experts ({self.experts})")
        return self

    @property
    def key_value_heads(self) -> int:
        """Key/value heads."""
        return self.kv_heads or self.heads

    @property
    def top_k(self) -> int:
        """Experts each token of a mixture of experts is routed to (``experts_per_token``)."""
        return self.experts_per_token or DEFAULT_EXPERTS_PER_TOKEN

    @property
    def intermediate(self) -> int:
        """MLP intermediate size d_ff."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        """Values per attention head: ``d_head``, by default H / heads."""
        return self.d_head or self.hidden // self.heads

    @property
    def attention_width(self) -> int:
        """Output features of the query projection (input features of the attention output projection)."""
        return self.heads * self.head_dim

    def norm_tensors(self) -> list[int]:
        """Elements of one norm's parameter tensors: a scale, and a shift where a layer norm has biases."""
        return [self.hidden, self.hidden] if self.norm == "layernorm" and self.bias else [self.hidden]

    def norm_parameters(self) -> int:
        """Parameters of one norm (:meth:`norm_tensors`)."""
        return sum(self.norm_tensors())

    def mlp_parameters(self, features: int | None = None) -> int:
        """Parameters of one dense MLP, or of one expert of a mixture of experts (weights and biases);
        of ``features`` intermediate features where given (the shared expert's)."""
        h, f = self.hidden, features or self.intermediate
        up = 2 * f if self.activation == "swiglu" else f  # a gated MLP's gate and up projections
        return h * up + f * h + (up + h if self.bias else 0)

    def layer_parameters(self) -> int:
        """Parameters of one transformer layer: attention, the MLP (every expert of a mixture, its
        router and its shared expert), two norms; biases where the model has them."""
        h, q = self.hidden, self.attention_width
        kv = self.key_value_heads * self.head_dim
        attention = h * (q + 2 * kv) + q * h + ((q + 2 * kv) + h if self.bias else 0)
        if self.experts is None:
            mlp = self.mlp_parameters()
        else:
            mlp = self.experts * self.mlp_parameters() + h * self.experts
            if self.shared_expert_ffn:
                mlp += self.mlp_parameters(self.shared_expert_ffn)
        return attention + mlp + 2 * self.norm_parameters()

    def parameters(self) -> int:
        """Parameters of the whole model: the layers, the token embedding, the output layer where it
        is not tied to the embedding, and the final norm (learned position embeddings left out)."""
        tables = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_parameters() + tables * self.vocab * self.hidden + self.norm_parameters()

    def active_parameters(self) -> int:
        """Parameters one token's forward pass uses: :meth:`parameters` with only ``experts_per_token``
        experts of each mixture (all of them for a dense model)."""
        if self.experts is None:
            return self.parameters()
        unused = self.layers * (self.experts - self.top_k) * self.mlp_parameters()
        return self.parameters() - unused


def model_dirs() -> list[Path]:
    """Folders searched for models: ``$GPUSIM_MODELS`` then the repository's ``workloads/models``."""
    dirs = [Path(p) for p in os.environ.get(MODELS_ENV, "").split(os.pathsep) if p]
    dirs.append(data_root() / "workloads" / "models")
    return dirs


def _model_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for root in reversed(model_dirs()):
        if root.is_dir():
            for path in sorted(root.glob("*.yaml")):
                files[path.stem] = path
    return files


def list_models() -> list[str]:
    """Names of the known models."""
    return sorted(_model_files())


def load_model(name_or_path: str | os.PathLike | ModelConfig, **overrides) -> ModelConfig:
    """A model by preset name (``"gpt3"``), YAML path, or an existing :class:`ModelConfig`.

    Parameters
    ----------
    name_or_path
        The model.
    overrides
        Fields to change, e.g. ``layers=2`` for a short version.

    Raises
    ------
    ConfigError
        Unknown model (the message lists the known ones) or an invalid file or override.
    """
    if isinstance(name_or_path, ModelConfig):
        data = name_or_path.model_dump()
        origin = f"model {name_or_path.name!r}"
    else:
        path = Path(name_or_path)
        files = _model_files()
        if path.suffix in (".yaml", ".yml"):
            origin_path = path
        elif str(name_or_path) in files:
            origin_path = files[str(name_or_path)]
        else:
            raise ConfigError(f"unknown model {str(name_or_path)!r}; known models: {', '.join(sorted(files))}")
        try:
            data = yaml.safe_load(origin_path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{origin_path}: cannot be read as YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{origin_path}: expected a mapping of fields at the top level")
        data.setdefault("name", origin_path.stem)
        origin = str(origin_path)
    unknown = [key for key in overrides if key not in ModelConfig.model_fields]
    if unknown:
        raise ConfigError(f"{origin}: override '{unknown[0]}' is not a model field; fields: {', '.join(ModelConfig.model_fields)}")
    data.update(overrides)
    try:
        return ModelConfig(**data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {'; '.join(_problem(error) for error in exc.errors())}") from None


def _problem(error: dict) -> str:
    """One of pydantic's errors in a model file as the hardware files say theirs: the field (or the
    fields a check of several compares), the likely field an unknown one was meant to be, and the
    value received."""
    field = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        likely = difflib.get_close_matches(field, ModelConfig.model_fields, n=1)
        return f"field '{field}': unknown field" + (f" (did you mean '{likely[0]}'?)" if likely else
                                                     f"; fields: {', '.join(ModelConfig.model_fields)}")
    if not field:  # a check across fields (hidden and heads); its message names them
        return message
    value = error["input"]
    shown = error["type"] != "missing" and not isinstance(value, dict) and repr(value) not in message
    return f"field '{field}': {message}" + (f" (got {value!r})" if shown else "")
